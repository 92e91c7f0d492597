package docscheck

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/scanner"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// typeCheck type-checks the package of every unit (byDir: directory name
// under mod → unit) as the compiler would, and returns the errors with the
// positions the code's //line directives give.
//
// Building the blocks with go build would cost a compiler process per block,
// each loading the export data of every package it imports (etcd's client
// alone is large). Instead one go list -export -deps call builds (or finds
// in the build cache) the export data of everything the blocks import, and
// go/types checks every block in this process with one importer, which
// reads each dependency once.
func typeCheck(gocmd, tmp, mod, goVersion string, byDir map[string]*unit) ([]checkError, string, error) {
	fset := token.NewFileSet()
	files := map[string][]*ast.File{}
	paths := map[string]bool{}
	var dirs []string
	for dir := range byDir {
		dirs = append(dirs, dir)
	}
	sort.Strings(dirs)
	var probs []checkError
	dir := ""
	for _, dir = range dirs {
		ents, err := os.ReadDir(filepath.Join(mod, dir))
		if err != nil {
			return nil, "", err
		}
		for _, e := range ents {
			name := filepath.Join(mod, dir, e.Name())
			f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
			if err != nil {
				for _, p := range scanProblems(err) {
					probs = append(probs, checkError{p, dir})
				}
				continue
			}
			files[dir] = append(files[dir], f)
			for _, is := range f.Imports {
				if p, err := strconv.Unquote(is.Path.Value); err == nil && p != "C" {
					paths[p] = true
				}
			}
		}
	}
	export, out, err := exportData(gocmd, tmp, mod, paths)
	if err != nil {
		return nil, out, err
	}
	imp := importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) {
		f := export[path]
		if f == "" {
			return nil, fmt.Errorf("no export data for %q (not in the workspace's build list?)", path)
		}
		return os.Open(f)
	})
	conf := types.Config{
		Importer:  imp,
		GoVersion: "go" + majorMinor(goVersion),
		Error: func(err error) {
			var te types.Error
			if errors.As(err, &te) {
				pos := te.Fset.Position(te.Pos)
				probs = append(probs, checkError{Problem{File: pos.Filename, Line: pos.Line, Msg: te.Msg}, dir})
				return
			}
			probs = append(probs, checkError{Problem{Msg: err.Error()}, dir})
		},
	}
	for _, dir = range dirs {
		if len(files[dir]) == 0 {
			continue
		}
		_, _ = conf.Check("docscheck.local/blocks/"+dir, fset, files[dir], nil)
	}
	return probs, "", nil
}

// A checkError is a type checker's error in the package of one block.
type checkError struct {
	Problem
	dir string // the block's directory under the module
}

// exportData returns the export data file of every package in paths and
// their dependencies, from one go list call in the temporary workspace.
func exportData(gocmd, tmp, mod string, paths map[string]bool) (map[string]string, string, error) {
	args := []string{"list", "-e", "-export", "-deps", "-f", "{{.ImportPath}}\t{{.Export}}"}
	for p := range paths {
		args = append(args, p)
	}
	sort.Strings(args[6:])
	cmd := exec.Command(gocmd, args...)
	cmd.Dir = mod
	cmd.Env = append(os.Environ(), "GOWORK="+filepath.Join(tmp, "go.work"), "GOFLAGS=", "GOTOOLCHAIN=local")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, "GOWORK=" + filepath.Join(tmp, "go.work") + " go " + strings.Join(args, " ") + "\n" + stderr.String(), fmt.Errorf("go list failed: %v", err)
	}
	export := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		path, file, ok := strings.Cut(sc.Text(), "\t")
		if ok && file != "" {
			export[path] = file
		}
	}
	return export, "", nil
}

func scanProblems(err error) []Problem {
	var list scanner.ErrorList
	if errors.As(err, &list) {
		var probs []Problem
		for _, e := range list {
			probs = append(probs, Problem{File: e.Pos.Filename, Line: e.Pos.Line, Msg: e.Msg})
		}
		return probs
	}
	return []Problem{{Msg: err.Error()}}
}

// majorMinor cuts a Go version to its language version: "1.26.0" → "1.26".
func majorMinor(v string) string {
	parts := strings.SplitN(v, ".", 3)
	if len(parts) < 2 {
		return v
	}
	return parts[0] + "." + parts[1]
}
