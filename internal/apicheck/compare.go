package main

import (
	"archive/zip"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// A change is one incompatible change apidiff reports in a package; Name
// is empty when the package itself was removed.
type change struct {
	Pkg, Name, What string
}

func (c change) String() string {
	if c.Name == "" {
		return c.Pkg + ": " + c.What
	}
	return c.Pkg + ": " + c.Name + ": " + c.What
}

// checker compares the modules released at tag with the work tree.
type checker struct {
	repo, tag, tmp string
	out            io.Writer
	apidiff        string // the installed binary
	n              int    // names the temporary files
}

func (c *checker) changes() ([]change, error) {
	old := filepath.Join(c.tmp, "old")
	if err := extract(c.repo, c.tag, old); err != nil {
		return nil, err
	}
	tracked, err := gitOut(c.repo, "ls-tree", "-r", "--name-only", "-z", c.tag)
	if err != nil {
		return nil, err
	}
	oldMods, err := modules(old, tracked)
	if err != nil {
		return nil, err
	}
	// The work tree's files, committed or not, but not ignored ones.
	files, err := gitOut(c.repo, "ls-files", "-z", "-co", "--exclude-standard")
	if err != nil {
		return nil, err
	}
	newMods, err := modules(c.repo, files)
	if err != nil {
		return nil, err
	}
	if err := c.install(); err != nil {
		return nil, err
	}
	version := c.tag[strings.LastIndex(c.tag, "/")+1:]
	var changes []change
	for _, m := range oldMods {
		tag := filepath.ToSlash(filepath.Join(m.Dir, version))
		released, err := tagExists(c.repo, tag)
		if err != nil {
			return nil, err
		}
		if !released {
			continue // no API to keep
		}
		fmt.Fprintf(c.out, "apicheck: %s: comparing with %s\n", m.Path, tag)
		mc, err := c.module(old, oldMods, newMods, m)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", m.Path, err)
		}
		changes = append(changes, mc...)
	}
	return changes, nil
}

// module compares module m of the old tree with the work tree's.
func (c *checker) module(old string, oldMods, newMods []module, m module) ([]change, error) {
	oldAPI, err := c.export(old, oldMods, m)
	if err != nil {
		return nil, err
	}
	gowork, err := c.workspace(old, oldMods, m)
	if err != nil {
		return nil, err
	}
	skip, err := commands(old, gowork, m)
	if err != nil {
		return nil, err
	}
	newAPI := map[string][]byte{}
	if i := slices.IndexFunc(newMods, func(n module) bool { return n.Path == m.Path }); i >= 0 {
		if newAPI, err = c.export(c.repo, newMods, newMods[i]); err != nil {
			return nil, err
		}
	}
	var changes []change
	for _, pkg := range slices.Sorted(maps.Keys(oldAPI)) {
		if skip[pkg] || internal(pkg, m.Path) {
			continue
		}
		if _, ok := newAPI[pkg]; !ok {
			changes = append(changes, change{Pkg: pkg, What: "package removed"})
			continue
		}
		pc, err := c.compare(pkg, oldAPI[pkg], newAPI[pkg])
		if err != nil {
			return nil, err
		}
		changes = append(changes, pc...)
	}
	return changes, nil
}

// internal reports whether pkg is internal to its module, as apidiff
// decides it.
func internal(pkg, mod string) bool {
	rel := strings.TrimPrefix(pkg, mod)
	return rel == "internal" || strings.HasPrefix(rel, "internal/") || strings.HasSuffix(rel, "/internal") || strings.Contains(rel, "/internal/")
}

// install puts apidiff at the pinned version into c.tmp.
func (c *checker) install() error {
	bin := filepath.Join(c.tmp, "bin")
	cmd := exec.Command("go", "install", "golang.org/x/exp/cmd/apidiff@"+apidiffVersion)
	cmd.Env = append(os.Environ(), "GOBIN="+bin, "GOWORK=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go install apidiff: %v\n%s", err, out)
	}
	c.apidiff = filepath.Join(bin, "apidiff")
	return nil
}

// export returns the export data of every package of module m in tree, by
// import path, as apidiff -m -w writes it.
func (c *checker) export(tree string, mods []module, m module) (map[string][]byte, error) {
	gowork, err := c.workspace(tree, mods, m)
	if err != nil {
		return nil, err
	}
	file := filepath.Join(filepath.Dir(gowork), "api.zip")
	cmd := exec.Command(c.apidiff, "-m", "-w", file, m.Path)
	cmd.Dir = filepath.Join(tree, m.Dir)
	cmd.Env = loadEnv(gowork)
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("apidiff -m -w in %s: %v\n%s", cmd.Dir, err, out)
	}
	z, err := zip.OpenReader(file)
	if err != nil {
		return nil, err
	}
	defer z.Close()
	api := map[string][]byte{}
	for _, f := range z.File {
		pkg, ok := strings.CutSuffix(f.Name, ".x")
		if !ok {
			continue // the entry "module"
		}
		r, err := f.Open()
		if err != nil {
			return nil, err
		}
		data, err := io.ReadAll(r)
		r.Close()
		if err != nil {
			return nil, err
		}
		api[pkg] = data
	}
	return api, nil
}

// workspace writes a go.work for loading module m of tree and returns its
// path: m and every module of the tree not inside m's directory (so that
// the pattern M/... names m's packages only, and m's requires of the
// tree's modules resolve to the tree, with or without replace
// directives). The tree's go.work.sum goes along; the go command may add
// to the copy, never to the tree.
func (c *checker) workspace(tree string, mods []module, m module) (string, error) {
	c.n++
	dir := filepath.Join(c.tmp, fmt.Sprintf("work%d", c.n))
	var use []string
	goVersion := m.Go
	for _, o := range mods {
		if o.Dir != m.Dir && (m.Dir == "." || strings.HasPrefix(o.Dir+"/", m.Dir+"/")) {
			continue
		}
		use = append(use, "\t"+strconv.Quote(filepath.Join(tree, o.Dir))+"\n")
		if versionLess(goVersion, o.Go) {
			goVersion = o.Go
		}
	}
	work := "go " + goVersion + "\n\nuse (\n" + strings.Join(use, "") + ")\n"
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(dir, "go.work"), []byte(work), 0o644); err != nil {
		return "", err
	}
	if sum, err := os.ReadFile(filepath.Join(tree, "go.work.sum")); err == nil {
		if err := os.WriteFile(filepath.Join(dir, "go.work.sum"), sum, 0o644); err != nil {
			return "", err
		}
	}
	return filepath.Join(dir, "go.work"), nil
}

// loadEnv is the environment of the go commands that load a tree's
// packages: the workspace of one module, and -trimpath so that the
// packages of the old tree, extracted into a new directory each time, are
// found in the build cache.
func loadEnv(gowork string) []string {
	return append(os.Environ(), "GOWORK="+gowork, "GOFLAGS="+strings.TrimSpace(os.Getenv("GOFLAGS")+" -trimpath"))
}

// commands returns the import paths of module m's package main.
func commands(tree, gowork string, m module) (map[string]bool, error) {
	cmd := exec.Command("go", "list", "-e", "-f", "{{.Name}} {{.ImportPath}}", m.Path+"/...")
	cmd.Dir = filepath.Join(tree, m.Dir)
	cmd.Env = loadEnv(gowork)
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go list in %s: %v", cmd.Dir, err)
	}
	cmds := map[string]bool{}
	for _, line := range strings.Split(string(out), "\n") {
		if name, pkg, ok := strings.Cut(line, " "); ok && name == "main" {
			cmds[pkg] = true
		}
	}
	return cmds, nil
}

// compare runs apidiff on one package's two export data and returns its
// incompatible changes.
func (c *checker) compare(pkg string, old, new []byte) ([]change, error) {
	c.n++
	files := [2]string{}
	for i, data := range [][]byte{old, new} {
		files[i] = filepath.Join(c.tmp, fmt.Sprintf("pkg%d-%d.x", c.n, i))
		// apidiff's file of one package: its path on a line, then the data.
		if err := os.WriteFile(files[i], append([]byte(pkg+"\n"), data...), 0o644); err != nil {
			return nil, err
		}
	}
	out, err := exec.Command(c.apidiff, "-incompatible", files[0], files[1]).CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("apidiff %s: %v\n%s", pkg, err, out)
	}
	return parseReport(pkg, string(out)), nil
}

// parseReport reads apidiff's "- NAME: WHAT" lines.
func parseReport(pkg, out string) []change {
	var changes []change
	for _, line := range strings.Split(out, "\n") {
		line, ok := strings.CutPrefix(line, "- ")
		if !ok {
			continue
		}
		name, what, _ := strings.Cut(line, ": ")
		changes = append(changes, change{Pkg: pkg, Name: name, What: what})
	}
	return changes
}
