package docscheck

import (
	"bytes"
	"fmt"
	"go/ast"
	"go/parser"
	"go/printer"
	"go/token"
	"os"
	"path/filepath"
	"strings"
)

// Family maps the name of each package of the family to its directory,
// relative to the repository root. Only these are checked by name.
var Family = map[string]string{
	"lock":       ".",
	"backend":    "backend",
	"locktest":   "locktest",
	"memlock":    "memlock",
	"flock":      "flock",
	"filelock":   "filelock",
	"pglock":     "pglock",
	"redislock":  "redislock",
	"etcdlock":   "etcdlock",
	"gocronlock": "contrib/gocronlock",
}

// A Package is what the checks know of one package's exported API, read
// from its non-test sources (every build variant at once).
type Package struct {
	Name    string
	Funcs   map[string]*ast.FuncDecl
	Values  map[string]bool                     // package-level vars and consts
	Consts  map[string]ast.Expr                 // package-level consts with an explicit value
	Types   map[string]bool                     // declared type names
	Members map[string]map[string]*ast.FuncType // type → method or field → signature (nil for fields)
}

// Has reports whether name is a package-level declaration.
func (p *Package) Has(name string) bool {
	return p.Funcs[name] != nil || p.Values[name] || p.Types[name]
}

// HasMember reports whether typ has a method or field called member.
func (p *Package) HasMember(typ, member string) bool {
	_, ok := p.Members[typ][member]
	return ok
}

// LoadPackage parses the non-test Go files of dir.
func LoadPackage(dir string) (*Package, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	p := &Package{
		Funcs:   map[string]*ast.FuncDecl{},
		Values:  map[string]bool{},
		Consts:  map[string]ast.Expr{},
		Types:   map[string]bool{},
		Members: map[string]map[string]*ast.FuncType{},
	}
	fset := token.NewFileSet()
	for _, e := range ents {
		n := e.Name()
		if e.IsDir() || !strings.HasSuffix(n, ".go") || strings.HasSuffix(n, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, n), nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, err
		}
		if p.Name == "" {
			p.Name = f.Name.Name
		}
		p.add(f)
	}
	if p.Name == "" {
		return nil, fmt.Errorf("%s: no Go files", dir)
	}
	return p, nil
}

func (p *Package) member(typ string) map[string]*ast.FuncType {
	m := p.Members[typ]
	if m == nil {
		m = map[string]*ast.FuncType{}
		p.Members[typ] = m
	}
	return m
}

func (p *Package) add(f *ast.File) {
	for _, decl := range f.Decls {
		switch d := decl.(type) {
		case *ast.FuncDecl:
			if d.Recv == nil {
				p.Funcs[d.Name.Name] = d
				continue
			}
			if len(d.Recv.List) == 1 {
				p.member(recvName(d.Recv.List[0].Type))[d.Name.Name] = d.Type
			}
		case *ast.GenDecl:
			for _, s := range d.Specs {
				switch s := s.(type) {
				case *ast.ValueSpec:
					for i, n := range s.Names {
						p.Values[n.Name] = true
						if d.Tok == token.CONST && i < len(s.Values) {
							p.Consts[n.Name] = s.Values[i]
						}
					}
				case *ast.TypeSpec:
					p.Types[s.Name.Name] = true
					m := p.member(s.Name.Name)
					switch t := s.Type.(type) {
					case *ast.StructType:
						for _, fld := range t.Fields.List {
							for _, n := range fieldNames(fld) {
								m[n] = nil
							}
						}
					case *ast.InterfaceType:
						for _, fld := range t.Methods.List {
							ft, _ := fld.Type.(*ast.FuncType)
							for _, n := range fld.Names {
								m[n.Name] = ft
							}
						}
					}
				}
			}
		}
	}
}

// fieldNames returns a struct field's names, or an embedded field's type
// name.
func fieldNames(f *ast.Field) []string {
	if len(f.Names) > 0 {
		var ns []string
		for _, n := range f.Names {
			ns = append(ns, n.Name)
		}
		return ns
	}
	return []string{recvName(f.Type)}
}

// recvName is the base type name of a receiver or embedded type.
func recvName(e ast.Expr) string {
	for {
		switch t := e.(type) {
		case *ast.StarExpr:
			e = t.X
		case *ast.IndexExpr:
			e = t.X
		case *ast.IndexListExpr:
			e = t.X
		case *ast.SelectorExpr:
			return t.Sel.Name
		case *ast.Ident:
			return t.Name
		default:
			return ""
		}
	}
}

// Signature renders a function type without parameter names, so that a
// documented signature can be compared with the declared one.
func Signature(ft *ast.FuncType) string {
	return "(" + fieldTypes(ft.Params) + ")" + results(ft.Results)
}

func results(fl *ast.FieldList) string {
	s := fieldTypes(fl)
	if s == "" {
		return ""
	}
	return " (" + s + ")"
}

func fieldTypes(fl *ast.FieldList) string {
	if fl == nil {
		return ""
	}
	var parts []string
	for _, f := range fl.List {
		n := max(len(f.Names), 1)
		for range n {
			parts = append(parts, typeString(f.Type))
		}
	}
	return strings.Join(parts, ", ")
}

func typeString(e ast.Expr) string {
	switch t := e.(type) {
	case *ast.Ident:
		return t.Name
	case *ast.SelectorExpr:
		return typeString(t.X) + "." + t.Sel.Name
	case *ast.StarExpr:
		return "*" + typeString(t.X)
	case *ast.Ellipsis:
		return "..." + typeString(t.Elt)
	case *ast.ArrayType:
		if t.Len == nil {
			return "[]" + typeString(t.Elt)
		}
		return "[" + exprString(t.Len) + "]" + typeString(t.Elt)
	case *ast.MapType:
		return "map[" + typeString(t.Key) + "]" + typeString(t.Value)
	case *ast.ChanType:
		switch t.Dir {
		case ast.SEND:
			return "chan<- " + typeString(t.Value)
		case ast.RECV:
			return "<-chan " + typeString(t.Value)
		}
		return "chan " + typeString(t.Value)
	case *ast.FuncType:
		return "func" + Signature(t)
	case *ast.ParenExpr:
		return typeString(t.X)
	}
	return exprString(e)
}

func exprString(e ast.Expr) string {
	var b bytes.Buffer
	_ = printer.Fprint(&b, token.NewFileSet(), e)
	return strings.Join(strings.Fields(b.String()), " ")
}
