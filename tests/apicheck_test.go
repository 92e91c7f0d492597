package tests

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestAPICheck runs internal/apicheck (make test's API check) on a
// repository of its own in a temporary directory: a root module with a
// nested one, released at v0.1.0, then changed in the work tree. An
// incompatible change fails the check until the Unreleased section of
// CHANGELOG.md names it under "### Breaking"; compatible changes,
// internal packages, commands and an unreleased module never do. The
// repository itself may have no release tag yet, where the check has
// nothing to compare with: this is the test that it can fail.
func TestAPICheck(t *testing.T) {
	if testing.Short() {
		t.Skip("installs apidiff with go install (module cache or proxy)")
	}
	top, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		t.Skipf("not in a git work tree (%v)", err)
	}
	work := t.TempDir()
	bin := filepath.Join(work, "apicheck")
	goCmd(t, strings.TrimSpace(string(top)), os.Environ(), "build", "-o", bin, "./internal/apicheck")

	repo := filepath.Join(work, "repo")
	for name, data := range map[string]string{
		"go.work":          "go 1.26.0\n\nuse (\n\t.\n\t./sub\n\t./tools\n)\n",
		"go.mod":           "module example.com/m\n\ngo 1.26.0\n",
		"m.go":             "package m\n\nfunc Old() {}\n\ntype T struct{ F int }\n\nfunc (*T) M() {}\n",
		"extra/extra.go":   "package extra\n\nfunc E() {}\n",
		"internal/x/x.go":  "package x\n\nfunc Gone() {}\n",
		"cmd/tool/main.go": "package main\n\nfunc Exported() {}\n\nfunc main() {}\n",
		"sub/go.mod":       "module example.com/m/sub\n\ngo 1.26.0\n\nrequire example.com/m v0.0.0\n\nreplace example.com/m => ..\n",
		"sub/sub.go":       "package sub\n\nimport \"example.com/m\"\n\nfunc New() *m.T { return nil }\n\nfunc Drop() {}\n",
		"tools/go.mod":     "module example.com/m/tools\n\ngo 1.26.0\n",
		"tools/tools.go":   "package tools\n\nfunc X() {}\n",
		"CHANGELOG.md":     "# Changelog\n\n## [Unreleased]\n\n### Added\n\n- Nothing yet.\n",
	} {
		writeFile(t, filepath.Join(repo, name), data)
	}
	git(t, repo, "init", "-q")
	git(t, repo, "add", "-A")
	git(t, repo, "commit", "-q", "-m", "v0.1.0")

	check := func(wantStatus int, want, notWant []string) {
		t.Helper()
		cmd := exec.Command(bin, "-C", repo)
		out, err := cmd.CombinedOutput()
		status := 0
		if exit, ok := err.(*exec.ExitError); ok {
			status = exit.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		if status != wantStatus {
			t.Errorf("apicheck exit status %d, want %d; output:\n%s", status, wantStatus, out)
		}
		for _, w := range want {
			if !strings.Contains(string(out), w) {
				t.Errorf("apicheck output lacks %q:\n%s", w, out)
			}
		}
		for _, w := range notWant {
			if strings.Contains(string(out), w) {
				t.Errorf("apicheck output has %q:\n%s", w, out)
			}
		}
	}

	// No release yet: nothing to compare with.
	check(0, []string{"no release tag"}, nil)
	git(t, repo, "tag", "v0.1.0")
	git(t, repo, "tag", "sub/v0.1.0")
	check(0, []string{"example.com/m: comparing with v0.1.0", "example.com/m/sub: comparing with sub/v0.1.0"}, []string{"example.com/m/tools"})

	// Compatible changes, and changes to what is no API.
	writeFile(t, filepath.Join(repo, "m.go"), "package m\n\nfunc Old() {}\n\nfunc Added() {}\n\ntype T struct{ F, G int }\n\nfunc (*T) M() {}\n")
	writeFile(t, filepath.Join(repo, "internal/x/x.go"), "package x\n\nfunc Gone(int) {}\n")
	writeFile(t, filepath.Join(repo, "cmd/tool/main.go"), "package main\n\nfunc main() {}\n")
	writeFile(t, filepath.Join(repo, "tools/tools.go"), "package tools\n")
	check(0, []string{"compatible with v0.1.0"}, []string{"not announced"})

	// Incompatible changes, uncommitted.
	writeFile(t, filepath.Join(repo, "m.go"), "package m\n\nfunc Added() {}\n\ntype T struct{ F, G int }\n\nfunc (*T) M(int) {}\n")
	writeFile(t, filepath.Join(repo, "sub/sub.go"), "package sub\n\nimport \"example.com/m\"\n\nfunc New() *m.T { return nil }\n")
	os.RemoveAll(filepath.Join(repo, "extra"))
	notAnnounced := []string{
		"not announced: example.com/m: Old: removed",
		"not announced: example.com/m: (*T).M: changed from func() to func(int)",
		"not announced: example.com/m/sub: Drop: removed",
		"not announced: example.com/m/extra: package removed",
		"4 incompatible change(s) since v0.1.0",
	}
	check(1, notAnnounced, []string{"example.com/m/internal", "example.com/m/cmd/tool", "Exported", "example.com/m/tools"})

	// Named, but not under Breaking in Unreleased.
	changelog := "# Changelog\n\n## [Unreleased]\n\n### Removed\n\n" +
		"- `example.com/m`: `Old`; `example.com/m/sub`: `Drop`; `example.com/m/extra`.\n" +
		"- `example.com/m`: `T.M` takes an int.\n\n" +
		"## [0.1.0]\n\n### Breaking\n\n- `example.com/m`: `Old`, `T.M`.\n"
	writeFile(t, filepath.Join(repo, "CHANGELOG.md"), changelog)
	check(1, notAnnounced, nil)

	// Some named under Breaking: the others still fail.
	changelog = "# Changelog\n\n## [Unreleased]\n\n### Breaking\n\n" +
		"- `example.com/m`: `Old` is gone; `T.M` takes the count\n  it works on.\n" +
		"- `example.com/m/extra` is gone.\n\n### Added\n\n- `example.com/m/sub`: `Drop` (not here).\n"
	writeFile(t, filepath.Join(repo, "CHANGELOG.md"), changelog)
	check(1, []string{
		"announced: example.com/m: Old: removed",
		"announced: example.com/m: (*T).M",
		"announced: example.com/m/extra: package removed",
		"not announced: example.com/m/sub: Drop: removed",
		"1 incompatible change(s) since v0.1.0",
	}, []string{"not announced: example.com/m: Old"})

	// All named.
	writeFile(t, filepath.Join(repo, "CHANGELOG.md"), strings.Replace(changelog,
		"- `example.com/m/extra` is gone.\n",
		"- `example.com/m/extra` is gone.\n- `example.com/m/sub`: `Drop` removed.\n", 1))
	check(0, []string{"announced: example.com/m/sub: Drop: removed", "but for the 4 change(s) CHANGELOG.md announces"}, []string{"not announced"})

	// The module whose tag is missing is not compared.
	git(t, repo, "tag", "-d", "sub/v0.1.0")
	writeFile(t, filepath.Join(repo, "CHANGELOG.md"), "# Changelog\n")
	check(1, []string{"3 incompatible change(s)"}, []string{"example.com/m/sub"})
}
