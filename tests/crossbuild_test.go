package tests

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// crossTargets are the systems besides this one that the modules are built
// on: Windows (flock's LockFileEx) and macOS.
var crossTargets = []struct{ goos, goarch string }{{"windows", "amd64"}, {"darwin", "arm64"}}

// notFor says why a module (its go.work path) is not vetted for a system.
var notFor = map[string]string{
	"filelock/windows": "filelock is unix-only by design: every file is //go:build unix, nothing to vet",
	"examples/windows": "the examples' default backend is filelock, which is unix-only",
	"bench/windows":    "bench is a Linux tool (flock(2) floors, SCHED_IDLE busy loop, Pdeathsig)",
	"bench/darwin":     "bench is a Linux tool (SCHED_IDLE busy loop, Pdeathsig)",
}

// Every module of the workspace, its tests included (vet compiles them),
// builds for the other systems. Each is vetted on its own (GOWORK=off), as
// a user who fetches it gets it: its go.mod must be complete, and the
// unpublished modules find their siblings through their relative replaces.
func TestCrossBuild(t *testing.T) {
	if testing.Short() {
		t.Skip("vets every module for two other systems: minutes, not a -short run's seconds")
	}
	goBin, err := exec.LookPath("go") // go test puts its own go first on PATH
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(goBin, "work", "edit", "-json", filepath.Join("..", "go.work")).Output()
	if err != nil {
		t.Fatalf("go work edit -json: %v", err)
	}
	var work struct{ Use []struct{ DiskPath string } }
	if err := json.Unmarshal(out, &work); err != nil || len(work.Use) == 0 {
		t.Fatalf("go.work: %v, %d modules", err, len(work.Use))
	}
	for _, target := range crossTargets {
		for _, use := range work.Use {
			mod := filepath.Clean(use.DiskPath)
			t.Run(target.goos+"/"+mod, func(t *testing.T) {
				if why, ok := notFor[mod+"/"+target.goos]; ok {
					t.Skip(why)
				}
				cmd := exec.Command(goBin, "vet", "./...")
				cmd.Dir = filepath.Join("..", mod)
				cmd.Env = append(os.Environ(), "GOOS="+target.goos, "GOARCH="+target.goarch, "CGO_ENABLED=0", "GOWORK=off")
				if out, err := cmd.CombinedOutput(); err != nil {
					t.Errorf("GOOS=%s GOARCH=%s GOWORK=off go vet ./... in %s: %v\n%s", target.goos, target.goarch, mod, err, out)
				}
			})
		}
	}
}
