package docscheck

import (
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"
)

// repoRoot is the repository root: two levels up from this package.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	mod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil || !strings.Contains(string(mod), "module "+ModulePath+"\n") {
		t.Skipf("not inside the %s repository (%s)", ModulePath, root)
	}
	return root
}

// goCommand returns the go command, or skips the test when there is none
// or it is older than the workspace needs.
func goCommand(t *testing.T, root string) string {
	t.Helper()
	gocmd, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command in PATH: Go blocks are not compiled")
	}
	w, err := ReadWorkspace(root)
	if err != nil {
		t.Skipf("no go.work to wire the blocks to the repository's modules: %v", err)
	}
	have, err := GoVersion(gocmd)
	if err != nil {
		t.Skipf("go env GOVERSION: %v", err)
	}
	if !VersionAtLeast(have, w.Go) {
		t.Skipf("go %s is older than the workspace's go %s: Go blocks are not compiled", have, w.Go)
	}
	return gocmd
}

func report(t *testing.T, what string, probs []Problem) {
	t.Helper()
	sort.SliceStable(probs, func(i, j int) bool {
		if probs[i].File != probs[j].File {
			return probs[i].File < probs[j].File
		}
		return probs[i].Line < probs[j].Line
	})
	for _, p := range probs {
		t.Errorf("%s", p)
	}
	if len(probs) > 0 {
		t.Logf("%d %s problem(s); the conventions are in internal/docscheck/doc.go", len(probs), what)
	}
}

// TestDocs runs every check on README.md and docs/**/*.md.
func TestDocs(t *testing.T) {
	root := repoRoot(t)
	c, err := NewChecker(root)
	if err != nil {
		t.Fatal(err)
	}
	t.Run("static", func(t *testing.T) {
		report(t, "static", c.Static())
	})
	t.Run("options", func(t *testing.T) {
		report(t, "options table", CheckOptionsTable(root, c.Pkgs))
	})
	t.Run("compile", func(t *testing.T) {
		gocmd := goCommand(t, root)
		dir := os.Getenv("DOCSCHECK_DIR") // to look at the generated module
		if dir == "" {
			dir = t.TempDir()
		}
		start := time.Now()
		probs, out, err := c.Compile(gocmd, dir)
		if err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		t.Logf("Go blocks: %v; type-checked in %v", c.Blocks(), time.Since(start).Round(time.Millisecond))
		report(t, "compile", probs)
	})
}

// TestOptionsTableCatches feeds the options check a table with every kind
// of mistake it looks for, against the real packages.
func TestOptionsTableCatches(t *testing.T) {
	root := repoRoot(t)
	pkgs, err := LoadFamily(root)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	src := "# Options\n" + // 1
		"\n" + // 2
		"| option | flock | redislock |\n" + // 3
		"|---|---|---|\n" + // 4
		"| `WithTTL(d)` | · | `DefaultTTL` = 15s |\n" + // 5: wrong value
		"| `WithKeyPrefix(p)` | · | \"lock:\" |\n" + // 6: default not cited
		"| `WithWait()` | after 2 tries | off |\n" + // 7: a number with no constant
		"| `WithMaxConcurrent(n)` | · | `DefaultLimit` = 1 |\n" + // 8: flock has it; no such constant
		"| `WithSchema(s)` | refused | · |\n" + // 9: · for another backend's option
		"| `WithDir(dir)` | `DefaultDir()` | refused |\n" + // 10: refused for a shared option
		"| `WithReplicaAck(n)` | refused | off |\n" + // 11: right
		"| `WithSweepAfter(d)` | `DefaultCheckInterval` = 1s | refused |\n" + // 12: right cell, wrong constant cited is allowed
		"| nothing here | · | · |\n" + // 13: no option
		"| `WithStaleAfter(d)` | as `WithTTL` | refused |\n" + // 14: right, then wrong: it is lock.WithTTL
		"| `WithCheckInterval(d)` | `DefaultCheckInterval` = 1s | as `WithTTL` |\n" // 15: not an alias
	if err := os.MkdirAll(filepath.Join(dir, "docs"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, filepath.FromSlash(OptionsDoc)), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	got := map[int][]string{}
	for _, p := range CheckOptionsTable(dir, pkgs) {
		got[p.Line] = append(got[p.Line], p.Msg)
	}
	want := map[int][]string{
		5:  {"the table says 15s, the code 30s"},
		6:  {"the default is redislock.DefaultKeyPrefix: cite it"},
		7:  {"states a number that is no Default constant of flock"},
		8:  {"flock has WithMaxConcurrent", "redislock.DefaultLimit does not exist"},
		9:  {"· is a shared option ignored, but lock has no WithSchema"},
		10: {"lock.WithDir is shared: redislock accepts and ignores it"},
		13: {"names no option"},
		14: {"WithStaleAfter is lock.WithTTL under another name"},
		15: {"no package defines WithCheckInterval as lock.WithTTL"},
		0:  {"redislock.WithShared has no row"},
	}
	wantProblems(t, got, want)
	for _, line := range []int{11, 12} {
		if len(got[line]) > 0 {
			t.Errorf("line %d: unexpected problems %q", line, got[line])
		}
	}
}

// TestCatches feeds the checks docs that are wrong in every way they
// look for, and expects each mistake to be reported at its line.
func TestCatches(t *testing.T) {
	root := repoRoot(t)
	dir := t.TempDir()
	guide := filepath.Join(dir, "docs", "guides", "memlock.md")
	src := "# memlock\n" + // 1
		"\n" + // 2
		"Use `memlock.NoSuchThing` and `lock.WithNoSuchOption()`.\n" + // 3
		"Pass `WithStaleAfter(d)`; `Factory.NoSuchMethod` too.\n" + // 4
		"See [the guide](no-such-file.md), [memlock](memlock.md#memlock) and [a heading](#no-such).\n" + // 5
		"\n" + // 6
		"```go\n" + // 7
		"locks := memlock.NewFactory()\n" + // 8
		"err := locks.WithLock(ctx, \"x\", runImport)\n" + // 9
		"locks.NoSuchMethod()\n" + // 10
		"```\n" + // 11
		"\n" + // 12
		"<!-- docscheck: skip -->\n" + // 13
		"```go\n" + // 14
		"this is pseudo-code, but memlock.Missing is still checked\n" + // 15
		"```\n" + // 16
		"\n" + // 17
		"```go\n" + // 18
		"func NewFactory(opts ...Option) *Holder\n" + // 19
		"```\n" + // 20
		"\n" + // 21
		"<!-- docscheck: api memlock -->\n" + // 22
		"```go\n" + // 23
		"func NewFactory(opts ...Option) *Factory\n" + // 24
		"func (h *Holder) Token() uint64\n" + // 25
		"```\n" + // 26
		"\n" + // 27
		"```go\n" + // 28
		"x := := 1\n" + // 29
		"```\n" + // 30
		"\n" + // 31
		"<!-- docscheck: vars runImport func(int) -->\n" + // 32
		"```go\n" + // 33
		"runImport(1)\n" + // 34
		"```\n" + // 35
		"<!-- docscheck: skip -->\n" + // 36
		"text, not a block\n" + // 37
		"\n" + // 38
		"```go\n" + // 39
		"package main\n" + // 40
		"\n" + // 41
		"func main() { unused := 1 }\n" + // 42
		"```\n" + // 43
		"<!-- docscheck: foreign -->\n" + // 44
		"```go\n" + // 45
		"lock, err := memlock.Obtain(ctx, \"x\") // another library's memlock\n" + // 46
		"```\n" // 47
	if err := os.MkdirAll(filepath.Dir(guide), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(guide, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	d := ParseMarkdown(guide, "docs/guides/memlock.md", src)
	c, err := NewCheckerDocs(root, []*Doc{d})
	if err != nil {
		t.Fatal(err)
	}
	// CheckLinks resolves against the doc's own directory.
	got := map[int][]string{}
	for _, p := range c.Static() {
		got[p.Line] = append(got[p.Line], p.Msg)
	}
	want := map[int][]string{
		3:  {"memlock.NoSuchThing does not exist", "lock.WithNoSuchOption does not exist"},
		4:  {"memlock has no WithStaleAfter", "memlock.Factory has no method or field NoSuchMethod"},
		5:  {"link target no-such-file.md does not exist", "link #no-such: no heading with that anchor"},
		15: {"memlock.Missing does not exist"},
		19: {"memlock.NewFactory: documented as func(...Option) (*Holder), declared as func(...Option) (*Factory)"},
		29: {"does not parse"},
		36: {"not followed by a code block"},
	}
	wantProblems(t, got, want)
	for line, msgs := range got {
		if _, ok := want[line]; !ok {
			t.Errorf("line %d: unexpected problems %q", line, msgs)
		}
	}

	gocmd := goCommand(t, root)
	probs, out, err := c.Compile(gocmd, t.TempDir())
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	got = map[int][]string{}
	for _, p := range probs {
		if p.File != "docs/guides/memlock.md" {
			t.Errorf("problem not mapped to the Markdown file: %s", p)
		}
		got[p.Line] = append(got[p.Line], p.Msg)
	}
	// Line 9's unused err is fine in a fragment; line 42's unused variable
	// is not, in a whole file.
	if !containsMsg(got[10], "NoSuchMethod") || !containsMsg(got[42], "declared and not used") || len(got) != 2 {
		t.Errorf("compile problems: want one at line 10 naming NoSuchMethod and one at 42, got %v", got)
	}
}

// wantProblems reports each wanted message that the problems at its line
// do not contain.
func wantProblems(t *testing.T, got, want map[int][]string) {
	t.Helper()
	for line, msgs := range want {
		for _, msg := range msgs {
			if !containsMsg(got[line], msg) {
				t.Errorf("line %d: want a problem %q, got %q", line, msg, got[line])
			}
		}
	}
}

func containsMsg(msgs []string, sub string) bool {
	for _, m := range msgs {
		if strings.Contains(m, sub) {
			return true
		}
	}
	return false
}

func TestWrap(t *testing.T) {
	for _, tc := range []struct {
		src, kind, result string
	}{
		{"x := 1\n", kindStmts, ""},
		{"if err != nil {\n\treturn err\n}\n", kindStmts, "error"},
		{"f := func() error { return nil }\n_ = f\n", kindStmts, ""},
		{"return false, nil\n", kindStmts, "(any, error)"},
		{"func F() {}\n", kindDecls, ""},
		{"func F()\n", kindListing, ""},
		{"package main\n\nfunc main() {}\n", kindFile, ""},
		{"// a comment first\npackage x\n", kindFile, ""},
	} {
		d := &Doc{Path: "/x.md", Rel: "x.md"}
		u, p := classify(&Block{Doc: d, Line: 1, Lang: "go", Text: tc.src})
		if p != nil {
			t.Errorf("%q: %v", tc.src, p)
			continue
		}
		if u.kind != tc.kind || u.result != tc.result {
			t.Errorf("%q: kind %s result %q, want %s %q", tc.src, u.kind, u.result, tc.kind, tc.result)
		}
	}
}

func TestParseMarkdown(t *testing.T) {
	src := "Text `a.B` and ``x ` y`` and `split\nspan` [l](t.md#frag \"title\").\n\n" +
		"- item\n\n  ```go\n  indented()\n  ```\n\n[ref]: ../r.md\n\n~~~~sh\n```\n~~~~\n"
	d := ParseMarkdown("/x.md", "x.md", src)
	var spans []string
	for _, s := range d.Spans {
		spans = append(spans, s.Text)
	}
	if got, want := strings.Join(spans, "|"), "a.B|x ` y|split span"; got != want {
		t.Errorf("spans %q, want %q", got, want)
	}
	if len(d.Links) != 2 || d.Links[0].Text != "t.md#frag" || d.Links[1].Text != "../r.md" || d.Links[1].Line != 10 {
		t.Errorf("links %+v", d.Links)
	}
	if len(d.Blocks) != 2 || d.Blocks[0].Text != "indented()\n" || d.Blocks[0].Line != 7 || d.Blocks[1].Text != "```\n" {
		for _, b := range d.Blocks {
			t.Logf("block at %d %q: %q", b.Line, b.Lang, b.Text)
		}
		t.Errorf("blocks wrong")
	}
}

func TestSignature(t *testing.T) {
	root := repoRoot(t)
	p, err := LoadPackage(root)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := Signature(p.Funcs["Lead"].Type), "(context.Context, Locker, string, func(context.Context, uint64) (error), ...LeadOption) (error)"; got != want {
		t.Errorf("Signature(Lead) = %s, want %s", got, want)
	}
	if !VersionAtLeast("1.26.8", "1.26.0") || VersionAtLeast("1.24.1", "1.26") || !VersionAtLeast("1.26rc1", "1.26") {
		t.Error("VersionAtLeast")
	}
}
