package docscheck

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Every backend keeps its Holder, and all of its methods, in holder.go, so
// a reader finds the same thing in the same file in each.
func TestHolderInHolderGo(t *testing.T) {
	root := repoRoot(t)
	for _, b := range []string{"flock", "filelock", "memlock", "pglock", "redislock", "etcdlock"} {
		files, err := filepath.Glob(filepath.Join(root, b, "*.go"))
		if err != nil || len(files) == 0 {
			t.Fatalf("%s: no Go files (%v)", b, err)
		}
		found := false
		for _, path := range files {
			if strings.HasSuffix(path, "_test.go") {
				continue
			}
			src, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			f, err := parser.ParseFile(token.NewFileSet(), path, src, parser.SkipObjectResolution)
			if err != nil {
				t.Fatal(err)
			}
			inHolder := filepath.Base(path) == "holder.go"
			for _, d := range f.Decls {
				switch d := d.(type) {
				case *ast.GenDecl:
					for _, s := range d.Specs {
						if ts, ok := s.(*ast.TypeSpec); ok && ts.Name.Name == "Holder" {
							found = found || inHolder
							if !inHolder {
								t.Errorf("%s: type Holder is declared in %s, not holder.go", b, filepath.Base(path))
							}
						}
					}
				case *ast.FuncDecl:
					if d.Recv != nil && receiver(d.Recv.List[0].Type) == "Holder" && !inHolder {
						t.Errorf("%s: method Holder.%s is declared in %s, not holder.go", b, d.Name.Name, filepath.Base(path))
					}
				}
			}
		}
		if !found {
			t.Errorf("%s: no type Holder in holder.go", b)
		}
	}
}

// receiver returns the type name of a method's receiver, T or *T.
func receiver(e ast.Expr) string {
	if s, ok := e.(*ast.StarExpr); ok {
		e = s.X
	}
	if id, ok := e.(*ast.Ident); ok {
		return id.Name
	}
	return ""
}
