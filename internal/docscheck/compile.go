package docscheck

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

// A Checker holds the docs and the family's API, and runs the checks.
type Checker struct {
	Root  string // the repository root
	Docs  []*Doc
	Pkgs  map[string]*Package
	units []*unit
	probs []Problem // from classifying the blocks
}

// NewChecker reads the docs in scope under root and the family's sources.
func NewChecker(root string) (*Checker, error) {
	docs, err := ReadDocs(root)
	if err != nil {
		return nil, err
	}
	return NewCheckerDocs(root, docs)
}

// NewCheckerDocs checks the given docs against the family under root.
func NewCheckerDocs(root string, docs []*Doc) (*Checker, error) {
	pkgs, err := LoadFamily(root)
	if err != nil {
		return nil, err
	}
	c := &Checker{Root: root, Docs: docs, Pkgs: pkgs}
	for _, d := range docs {
		c.probs = append(c.probs, d.Probs...)
		for _, b := range d.Blocks {
			if b.Lang != "go" {
				continue
			}
			u, p := classify(b)
			if p != nil {
				c.probs = append(c.probs, *p)
				continue
			}
			u.guide = pkgs[guidePackage(d.Rel)]
			c.units = append(c.units, u)
		}
	}
	return c, nil
}

// Static runs every check that needs no compiler: markers, block syntax,
// API listings, names, guide options and links.
func (c *Checker) Static() []Problem {
	probs := append([]Problem(nil), c.probs...)
	for _, u := range c.units {
		if u.kind == kindListing {
			probs = append(probs, checkListing(u, c.Pkgs)...)
		}
	}
	probs = append(probs, CheckNames(c.Docs, c.Pkgs)...)
	probs = append(probs, CheckOptions(c.Docs, c.Pkgs)...)
	probs = append(probs, CheckLinks(c.Root, c.Docs)...)
	return probs
}

// Blocks counts the Go blocks by how they are checked.
func (c *Checker) Blocks() map[string]int {
	n := map[string]int{}
	for _, u := range c.units {
		n[u.kind]++
	}
	return n
}

// Workspace is the go.work of the repository: its go version and the
// directories of its modules.
type Workspace struct {
	Go   string
	Use  []string // absolute
	Sum  []byte   // go.work.sum, if any
	Path string
}

var goLineRE = regexp.MustCompile(`(?m)^go[ \t]+(\S+)`)

// ReadWorkspace reads root/go.work.
func ReadWorkspace(root string) (*Workspace, error) {
	path := filepath.Join(root, "go.work")
	src, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	w := &Workspace{Path: path}
	if m := goLineRE.FindSubmatch(src); m != nil {
		w.Go = string(m[1])
	}
	inUse := false
	for _, line := range strings.Split(string(src), "\n") {
		if i := strings.Index(line, "//"); i >= 0 {
			line = line[:i]
		}
		f := strings.Fields(line)
		switch {
		case len(f) == 0:
		case inUse && f[0] == ")":
			inUse = false
		case inUse:
			w.Use = append(w.Use, filepath.Join(root, unquote(f[0])))
		case f[0] == "use" && len(f) > 1 && f[1] == "(":
			inUse = true
		case f[0] == "use" && len(f) > 1:
			w.Use = append(w.Use, filepath.Join(root, unquote(f[1])))
		}
	}
	w.Sum, _ = os.ReadFile(filepath.Join(root, "go.work.sum"))
	return w, nil
}

func unquote(s string) string {
	if u, err := strconv.Unquote(s); err == nil {
		return u
	}
	return s
}

// ignored are compiler complaints that a fragment cannot avoid: it is the
// middle of a function whose rest would use its variables and return.
var ignored = []string{"declared and not used", "imported and not used", "missing return"}

// Compile writes every Go block that is compiled into a package of one
// temporary module under tmp, wires it to the repository's modules through
// a go.work, and type-checks them all as the compiler would (see
// typeCheck). It returns the errors as problems at their Markdown lines,
// and the go command's output when it could not run.
func (c *Checker) Compile(gocmd, tmp string) ([]Problem, string, error) {
	w, err := ReadWorkspace(c.Root)
	if err != nil {
		return nil, "", err
	}
	mod := filepath.Join(tmp, "m")
	if err := os.MkdirAll(mod, 0o755); err != nil {
		return nil, "", err
	}
	gomod := "module docscheck.local/blocks\n\ngo " + w.Go + "\n"
	if err := os.WriteFile(filepath.Join(mod, "go.mod"), []byte(gomod), 0o644); err != nil {
		return nil, "", err
	}
	work := "go " + w.Go + "\n\nuse (\n\t./m\n"
	for _, u := range w.Use {
		work += "\t" + strconv.Quote(u) + "\n"
	}
	work += ")\n"
	if err := os.WriteFile(filepath.Join(tmp, "go.work"), []byte(work), 0o644); err != nil {
		return nil, "", err
	}
	if w.Sum != nil {
		if err := os.WriteFile(filepath.Join(tmp, "go.work.sum"), w.Sum, 0o644); err != nil {
			return nil, "", err
		}
	}
	var probs []Problem
	byDir := map[string]*unit{}
	for i, u := range c.units {
		if u.kind == kindSkip || u.kind == kindListing {
			continue
		}
		name := fmt.Sprintf("b%03d", i)
		dir := filepath.Join(mod, name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, "", err
		}
		if p := u.write(dir); p != nil {
			probs = append(probs, *p)
			continue
		}
		byDir[name] = u
	}
	if len(byDir) == 0 {
		return probs, "", nil
	}
	tprobs, out, err := typeCheck(gocmd, tmp, mod, w.Go, byDir)
	if err != nil {
		return probs, out, err
	}
	for _, e := range tprobs {
		u, p := byDir[e.dir], e.Problem
		if u != nil && u.kind != kindFile && isIgnored(p.Msg) {
			continue // a whole file must be complete; a fragment cannot be
		}
		if rel, ok := c.docRel(p.File); ok {
			p.File = rel
		} else if u != nil {
			p.File, p.Line = u.b.Doc.Rel, u.b.Line
			p.Msg += " (in the code docscheck wraps the block in)"
		}
		p.Msg = "does not compile: " + p.Msg
		probs = append(probs, p)
	}
	return probs, "", nil
}

func isIgnored(msg string) bool {
	for _, s := range ignored {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}

// docRel returns the repository-relative name of a Markdown file that a
// compiler error names.
func (c *Checker) docRel(path string) (string, bool) {
	for _, d := range c.Docs {
		if filepath.Clean(d.Path) == filepath.Clean(path) {
			return d.Rel, true
		}
	}
	return "", false
}

// GoVersion returns the version the go command reports, like "1.26.8".
func GoVersion(gocmd string) (string, error) {
	out, err := exec.Command(gocmd, "env", "GOVERSION").Output()
	if err != nil {
		return "", err
	}
	return strings.TrimPrefix(strings.TrimSpace(string(bytes.TrimSpace(out))), "go"), nil
}

// VersionAtLeast reports whether Go version have is at least want
// ("1.26.8" against "1.26.0"); suffixes like "rc1" count as their release.
func VersionAtLeast(have, want string) bool {
	h, w := versionParts(have), versionParts(want)
	for i := range 3 {
		if h[i] != w[i] {
			return h[i] > w[i]
		}
	}
	return true
}

func versionParts(v string) [3]int {
	var out [3]int
	for i, part := range strings.SplitN(v, ".", 3) {
		n := 0
		for _, r := range part {
			if r < '0' || r > '9' {
				break
			}
			n = n*10 + int(r-'0')
		}
		out[i] = n
	}
	return out
}
