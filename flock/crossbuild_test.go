package flock_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// The package builds and vets (tests included) for the systems it claims
// besides the one running the tests: Windows (LockFileEx) and macOS.
func TestCrossCompile(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		out, err2 := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), "env", "GOROOT").Output()
		if err2 != nil {
			t.Skipf("no go command: %v, %v", err, err2)
		}
		goBin = filepath.Join(strings.TrimSpace(string(out)), "bin", "go")
	}
	for _, target := range [][2]string{{"windows", "amd64"}, {"darwin", "arm64"}} {
		for _, args := range [][]string{{"build", "."}, {"vet", "."}} {
			cmd := exec.Command(goBin, args...)
			// GOWORK=off: the module must build on its own, as users get it.
			cmd.Env = append(os.Environ(), "GOOS="+target[0], "GOARCH="+target[1], "CGO_ENABLED=0", "GOWORK=off")
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Errorf("GOOS=%s GOARCH=%s go %s: %v\n%s", target[0], target[1], strings.Join(args, " "), err, out)
			}
		}
	}
}
