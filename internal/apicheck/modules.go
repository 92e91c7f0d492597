package main

import (
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// A module of one side of the comparison.
type module struct {
	Dir  string // relative to the tree, "." for the root
	Path string
	Go   string // the go directive
}

// modules lists the modules of tree: the go.mod files among files (NUL-
// separated paths relative to tree) outside testdata and vendor
// directories, the root first.
func modules(tree, files string) ([]module, error) {
	var mods []module
	for _, name := range strings.Split(files, "\x00") {
		if name != "go.mod" && !strings.HasSuffix(name, "/go.mod") {
			continue
		}
		if dirs := "/" + name; strings.Contains(dirs, "/testdata/") || strings.Contains(dirs, "/vendor/") {
			continue
		}
		data, err := os.ReadFile(filepath.Join(tree, filepath.FromSlash(name)))
		if errors.Is(err, os.ErrNotExist) {
			continue // deleted in the work tree
		}
		if err != nil {
			return nil, err
		}
		m := module{Dir: path.Dir(name), Path: directive(data, "module"), Go: directive(data, "go")}
		if m.Path == "" {
			return nil, fmt.Errorf("%s: no module directive", name)
		}
		mods = append(mods, m)
	}
	slices.SortFunc(mods, func(a, b module) int { return strings.Compare(a.Dir, b.Dir) })
	return mods, nil
}

// directive returns the argument of a go.mod's one-line directive.
func directive(gomod []byte, name string) string {
	for _, line := range strings.Split(string(gomod), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == name {
			return strings.Trim(f[1], `"`)
		}
	}
	return ""
}

// versionLess compares Go versions such as 1.26 and 1.26.0.
func versionLess(a, b string) bool {
	as, bs := strings.Split(a, "."), strings.Split(b, ".")
	for i := 0; i < max(len(as), len(bs)); i++ {
		var x, y int
		if i < len(as) {
			x, _ = strconv.Atoi(as[i])
		}
		if i < len(bs) {
			y, _ = strconv.Atoi(bs[i])
		}
		if x != y {
			return x < y
		}
	}
	return false
}
