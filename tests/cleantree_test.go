package tests

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestCleanTree runs, in a fresh clone, the go commands that a contributor,
// an editor or a linter runs without meaning to change anything, and
// fails if they leave the clone dirty: a go.work.sum that lacks a checksum
// the workspace needs gets the missing lines written by the first of them,
// and then scripts/release.sh refuses ("the work tree is not clean").
//
// The clone is of HEAD, so this checks the committed tree: changes not yet
// committed are not in it. It needs the module cache or the module proxy
// (the workspace's dependencies), hence not under -short.
//
// go build, go vet, go test and staticcheck load the packages (and so
// need the checksums) that go list -deps -test loads: the test runs that,
// for every system lint.sh checks, in every module, and the compiling
// commands in the root module only, where they are cheap.
func TestCleanTree(t *testing.T) {
	if testing.Short() {
		t.Skip("needs the module cache or the module proxy")
	}
	top, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		t.Skipf("not in a git work tree (%v)", err)
	}
	src := strings.TrimSpace(string(top))
	head := git(t, src, "rev-parse", "HEAD")
	clone := filepath.Join(t.TempDir(), "repo")
	git(t, src, "clone", "-q", "--no-checkout", src, clone)
	git(t, clone, "fetch", "-q", src, "HEAD") // a detached HEAD is on no branch
	git(t, clone, "checkout", "-q", "--detach", head)

	env := append(os.Environ(), "GOWORK=", "GOFLAGS=-trimpath")
	run := func(dir string, extra []string, args ...string) {
		t.Helper()
		goCmd(t, dir, append(env, extra...), args...)
		if s := git(t, clone, "status", "--porcelain"); s != "" {
			rel, _ := filepath.Rel(clone, dir)
			t.Fatalf("in %s: go %s left the clone of %s dirty:\n%s\n%s\n"+
				"run the go commands of this test in your tree and commit what they add",
				rel, strings.Join(args, " "), head, s, git(t, clone, "diff"))
		}
	}

	run(clone, nil, "doc", ".")
	run(clone, nil, "list", "-m", "all")
	run(clone, nil, "build", "./...")
	run(clone, nil, "vet", "./...")
	run(clone, nil, "test", "-short", "-count=1", "-run", "^$", "./...")
	mods := strings.Fields(goCmd(t, clone, env, "list", "-m", "-f", "{{.Dir}}"))
	for _, goos := range []string{"", "windows", "darwin"} {
		var extra []string
		if goos != "" {
			extra = []string{"GOOS=" + goos, "CGO_ENABLED=0"}
		}
		for _, dir := range mods {
			run(dir, extra, "list", "-e", "-deps", "-test", "./...")
		}
	}
	for _, dir := range mods {
		run(dir, nil, "list", "-m", "all")
	}
}
