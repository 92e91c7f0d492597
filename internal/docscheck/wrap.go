package docscheck

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/scanner"
	"go/token"
	"go/types"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// imports maps the package names a fragment may use without importing them
// to their import paths. The family's packages are added from Family.
var imports = map[string]string{
	"atomic":      "sync/atomic",
	"bufio":       "bufio",
	"bytes":       "bytes",
	"context":     "context",
	"errors":      "errors",
	"exec":        "os/exec",
	"filepath":    "path/filepath",
	"fmt":         "fmt",
	"http":        "net/http",
	"io":          "io",
	"json":        "encoding/json",
	"log":         "log",
	"maps":        "maps",
	"os":          "os",
	"signal":      "os/signal",
	"slices":      "slices",
	"slog":        "log/slog",
	"sort":        "sort",
	"sql":         "database/sql",
	"strconv":     "strconv",
	"strings":     "strings",
	"sync":        "sync",
	"syscall":     "syscall",
	"testing":     "testing",
	"time":        "time",
	"clientv3":    "go.etcd.io/etcd/client/v3",
	"concurrency": "go.etcd.io/etcd/client/v3/concurrency",
	"gocron":      "github.com/go-co-op/gocron/v2",
	"pgconn":      "github.com/jackc/pgx/v5/pgconn",
	"pgx":         "github.com/jackc/pgx/v5",
	"pgxpool":     "github.com/jackc/pgx/v5/pgxpool",
	"redis":       "github.com/redis/go-redis/v9",
	"uuid":        "github.com/google/uuid",
}

// ModulePath is the family's root module.
const ModulePath = "github.com/ubgo/lock"

func init() {
	for name, dir := range Family {
		imports[name] = ImportPath(dir)
	}
}

// ImportPath is the import path of the family package in dir.
func ImportPath(dir string) string {
	if dir == "." {
		return ModulePath
	}
	return ModulePath + "/" + dir
}

// placeholders are the free variables a fragment may use without declaring
// them: what the surrounding program would have in scope. A vars marker
// adds to them or retypes them for one block.
var placeholders = map[string]string{
	// Clients and context.
	"ctx":  "context.Context",
	"rdb":  "*redis.Client",
	"pool": "*pgxpool.Pool",
	"cli":  "*clientv3.Client",
	"t":    "*testing.T",
	// A family factory (every factory has the same surface) and the
	// pattern helpers' stores.
	"locks":  "*memlock.Factory",
	"ledger": "lock.Ledger",
	"fence":  "lock.Fence",
	// Values a job has at hand.
	"name":     "string",
	"key":      "string",
	"jobID":    "string",
	"userID":   "string",
	"token":    "uint64",
	"tick":     "time.Time",
	"data":     "string",
	"meta":     "string",
	"k":        "string",
	"fenceKey": "string",
	"dataKey":  "string",
	// The application's own work.
	"runImport":     "func(ctx context.Context) error",
	"runJob":        "func(ctx context.Context) error",
	"runExport":     "func(ctx context.Context) error",
	"runBackup":     "func(ctx context.Context) error",
	"runMigrations": "func(ctx context.Context) error",
	"migrate":       "struct{ Run func(ctx context.Context, pool *pgxpool.Pool) error }", // the migration tool, as in the seed
	"aggregate":     "func(ctx context.Context) error",
	"syncJob":       "func(ctx context.Context) error",
	"work":          "func(ctx context.Context) error",
	"runLeaderWork": "func(ctx context.Context, epoch uint64) error",
	"export":        "func(ctx context.Context, fence uint64) error",
	"indexBatch":    "func(ctx context.Context, b Batch) error",
}

// guidePlaceholders retype placeholders in docs/guides/<pkg>.md, where they
// stand for that package's own types (when it declares them).
var guidePlaceholders = map[string]string{
	"locks":  "Factory",
	"fence":  "Fence",
	"ledger": "Ledger",
}

// placeholderTypes are the types a fragment may use without declaring them.
var placeholderTypes = map[string]string{
	"Batch": "struct{ ID int }",
}

// Fragment kinds.
const (
	kindSkip    = "skip"
	kindFile    = "file"    // a whole file, compiled as it is
	kindDecls   = "decls"   // top-level declarations
	kindStmts   = "stmts"   // statements, placed in a function body
	kindListing = "listing" // an API summary, checked against the sources
)

// A unit is one Go block, classified and ready to be written out.
type unit struct {
	b      *Block
	kind   string
	file   *ast.File // as parsed (wrapped for stmts)
	fset   *token.FileSet
	result string   // stmts: the wrapper's result list
	guide  *Package // the package of the guide the block is in, if any
}

// classify decides how to check b, or returns the parse error at its place
// in the Markdown file.
func classify(b *Block) (*unit, *Problem) {
	u := &unit{b: b, fset: token.NewFileSet()}
	_, skip := b.Marker("skip")
	if _, foreign := b.Marker("foreign"); skip || foreign {
		u.kind = kindSkip
		return u, nil
	}
	line := lineDirective(b.Doc.Path, b.Line)
	if startsWithPackage(b.Text) {
		f, err := parser.ParseFile(u.fset, "block.go", line+b.Text, 0)
		if err != nil {
			return nil, parseProblem(b, err)
		}
		u.kind, u.file = kindFile, f
		return u, nil
	}
	if f, err := parser.ParseFile(u.fset, "block.go", "package p\n"+line+b.Text, 0); err == nil {
		u.file, u.kind = f, kindDecls
		if _, ok := b.Marker("api"); ok || hasBodyless(f) {
			u.kind = kindListing
		}
		return u, nil
	}
	u.fset = token.NewFileSet()
	f, err := parser.ParseFile(u.fset, "block.go", "package p\nfunc _() {\n"+line+b.Text+"}\n", 0)
	if err != nil {
		return nil, parseProblem(b, err)
	}
	u.file, u.kind = f, kindStmts
	u.result = resultList(f.Decls[len(f.Decls)-1].(*ast.FuncDecl).Body)
	return u, nil
}

func lineDirective(path string, line int) string {
	return fmt.Sprintf("//line %s:%d\n", path, line)
}

func startsWithPackage(src string) bool {
	var s scanner.Scanner
	fset := token.NewFileSet()
	s.Init(fset.AddFile("", -1, len(src)), []byte(src), nil, 0)
	_, tok, _ := s.Scan()
	return tok == token.PACKAGE
}

func hasBodyless(f *ast.File) bool {
	for _, d := range f.Decls {
		if fd, ok := d.(*ast.FuncDecl); ok && fd.Body == nil {
			return true
		}
	}
	return false
}

func parseProblem(b *Block, err error) *Problem {
	if list, ok := err.(scanner.ErrorList); ok && len(list) > 0 {
		e := list[0]
		if e.Pos.Filename == b.Doc.Path {
			return &Problem{b.Doc.Rel, e.Pos.Line, "go block does not parse: " + e.Msg}
		}
		return &Problem{b.Doc.Rel, b.Line, "go block does not parse: " + e.Msg}
	}
	return &Problem{b.Doc.Rel, b.Line, "go block does not parse: " + err.Error()}
}

// resultList returns the result list a function needs to hold the
// statements of body: as many results as the widest top-level return
// statement (outside function literals), the last an error.
func resultList(body *ast.BlockStmt) string {
	n := 0
	ast.Inspect(body, func(node ast.Node) bool {
		switch x := node.(type) {
		case *ast.FuncLit:
			return false
		case *ast.ReturnStmt:
			n = max(n, len(x.Results))
		}
		return true
	})
	switch n {
	case 0:
		return ""
	case 1:
		return "error"
	}
	return "(" + strings.Repeat("any, ", n-1) + "error)"
}

// write puts the unit's package in dir: the block's file and, for
// fragments, a file declaring the placeholders it uses.
func (u *unit) write(dir string) *Problem {
	b := u.b
	line := lineDirective(b.Doc.Path, b.Line)
	if u.kind == kindFile {
		return writeFile(b, filepath.Join(dir, "block.go"), line+b.Text)
	}
	vars := map[string]string{}
	for k, v := range placeholders {
		vars[k] = v
	}
	if g := u.guide; g != nil {
		for k, typ := range guidePlaceholders {
			if g.Types[typ] {
				vars[k] = "*" + g.Name + "." + typ
			}
		}
	}
	varLine := map[string]int{}
	for _, m := range b.Markers {
		if m.Verb != "vars" {
			continue
		}
		for _, decl := range strings.Split(m.Arg, ";") {
			decl = strings.TrimSpace(decl)
			if decl == "" {
				continue
			}
			name, typ, ok := strings.Cut(decl, " ")
			if !ok {
				return &Problem{b.Doc.Rel, m.Line, fmt.Sprintf("docscheck vars: %q needs a name and a type", decl)}
			}
			vars[name] = strings.TrimSpace(typ)
			varLine[name] = m.Line
		}
	}
	have := importedNames(u.file)
	need := map[string]bool{}
	var decls, marked []string // marked: from a vars marker, mapped to its line
	for _, id := range unresolved(u.file) {
		switch {
		case have[id]:
		case vars[id] != "":
			if l, ok := varLine[id]; ok {
				marked = append(marked, lineDirective(b.Doc.Path, l)+"var "+id+" "+vars[id])
			} else {
				decls = append(decls, "var "+id+" "+vars[id])
			}
		case placeholderTypes[id] != "":
			decls = append(decls, "type "+id+" "+placeholderTypes[id])
		case imports[id] != "":
			need[id] = true
		}
	}
	decls = append(decls, marked...)
	if len(decls) > 0 {
		src := "package p\n\n" + strings.Join(decls, "\n") + "\n"
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, "vars.go", src, 0)
		if err != nil {
			return parseProblem(b, err)
		}
		src = "package p\n\n" + importDecl(unresolvedImports(f, nil)) + strings.Join(decls, "\n") + "\n"
		if p := writeFile(b, filepath.Join(dir, "vars.go"), src); p != nil {
			return p
		}
	}
	head := "package p\n\n" + importDecl(need)
	switch u.kind {
	case kindDecls:
		return writeFile(b, filepath.Join(dir, "block.go"), head+line+b.Text)
	case kindStmts:
		return writeFile(b, filepath.Join(dir, "block.go"), head+"func _() "+u.result+" {\n"+line+b.Text+"}\n")
	}
	return nil
}

func writeFile(b *Block, path string, src string) *Problem {
	if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
		return &Problem{b.Doc.Rel, b.Line, err.Error()}
	}
	return nil
}

// unresolved returns the identifiers f uses but does not declare, other
// than Go's predeclared ones, sorted and without repeats.
func unresolved(f *ast.File) []string {
	seen := map[string]bool{}
	var out []string
	for _, id := range f.Unresolved {
		if seen[id.Name] || types.Universe.Lookup(id.Name) != nil {
			continue
		}
		seen[id.Name] = true
		out = append(out, id.Name)
	}
	sort.Strings(out)
	return out
}

// unresolvedImports returns the package names among f's unresolved
// identifiers that imports knows and f does not import already.
func unresolvedImports(f *ast.File, have map[string]bool) map[string]bool {
	need := map[string]bool{}
	for _, id := range unresolved(f) {
		if !have[id] && imports[id] != "" {
			need[id] = true
		}
	}
	return need
}

// importedNames returns the names f's imports bind.
func importedNames(f *ast.File) map[string]bool {
	names := map[string]bool{}
	for _, is := range f.Imports {
		path, _ := strconv.Unquote(is.Path.Value)
		switch {
		case is.Name != nil:
			names[is.Name.Name] = true
		default:
			name := ""
			for n, p := range imports {
				if p == path {
					name = n
				}
			}
			if name == "" {
				name = path[strings.LastIndex(path, "/")+1:]
			}
			names[name] = true
		}
	}
	return names
}

func importDecl(names map[string]bool) string {
	if len(names) == 0 {
		return ""
	}
	var lines []string
	for n := range names {
		p := imports[n]
		if p[strings.LastIndex(p, "/")+1:] == n {
			lines = append(lines, "\t"+strconv.Quote(p))
		} else {
			lines = append(lines, "\t"+n+" "+strconv.Quote(p))
		}
	}
	sort.Strings(lines)
	return "import (\n" + strings.Join(lines, "\n") + "\n)\n\n"
}
