//go:build unix

package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ubgo/lock/internal/testenv"
)

// breakable are the backends lock break frees.
var breakable = []string{"filelock", "redislock", "etcdlock"}

func backendURL(t *testing.T, kind string) string {
	for _, be := range backends {
		if be.kind == kind {
			return be.url(t)
		}
	}
	t.Fatalf("no backend %s", kind)
	return ""
}

// runLockIn is runLock with stdin.
func runLockIn(t *testing.T, stdin string, args ...string) result {
	t.Helper()
	cmd, stdout, stderr := lockCmd(args...)
	cmd.Stdin = strings.NewReader(stdin)
	return wait(t, cmd, stdout, stderr, cmd.Start())
}

// break --yes frees a held lock at once: the next lock run -n gets it with
// a larger token, and the holder, alive, learns of the loss, kills its
// command's group and exits 75.
func TestBreakYes(t *testing.T) {
	for _, kind := range breakable {
		t.Run(kind, func(t *testing.T) {
			url, name := backendURL(t, kind), uniqueName(t)
			first, pids, dir, _ := startGroup(t, url, name, "--ttl", "3s", "--kill-after", "200ms")
			old := mustUint(t, strings.TrimSpace(awaitFile(t, filepath.Join(dir, "token"))))

			r := runLock(t, "break", "--backend", url, "--yes", name)
			r.want(t, 0, "break --yes")
			if r.stdout != "freed "+name+"\n" {
				t.Errorf("break --yes: stdout %q", r.stdout)
			}
			first().want(t, exitLost, "the broken holder's run")
			for _, pid := range pids {
				if processAlive(pid) {
					t.Errorf("process %d of the broken holder's group is alive after its run exited", pid)
				}
			}
			tok, _ := holdLock(t, url, name, "-n")
			if next := mustUint(t, tok); next <= old {
				t.Errorf("the next holder's token %d is not above the broken one's %d", next, old)
			}
		})
	}
}

// Without --yes, break shows who holds the name and asks: anything but y
// frees nothing; y frees it.
func TestBreakPrompt(t *testing.T) {
	for _, kind := range breakable {
		t.Run(kind, func(t *testing.T) {
			url, name := backendURL(t, kind), uniqueName(t)
			tok, _ := holdLock(t, url, name, "--owner", "owner-x")

			r := runLockIn(t, "n\n", "break", "--backend", url, name)
			r.want(t, exitRefused, "break answered n")
			if !strings.Contains(r.stderr, "owner-x") || !strings.Contains(r.stderr, tok) || !strings.Contains(r.stderr, "[y/N]") {
				t.Errorf("break's prompt does not show the holder (owner-x, token %s):\n%s", tok, r.stderr)
			}
			if !strings.Contains(r.stderr, "nothing done") {
				t.Errorf("break answered n: stderr %q does not say nothing was done", r.stderr)
			}
			if info := inspectJSON(t, url, name); len(info.Holders) != 1 {
				t.Errorf("after break answered n: %+v, want the lock still held", info)
			}
			runLockIn(t, "", "break", "--backend", url, name).want(t, exitRefused, "break with no answer")

			r = runLockIn(t, "y\n", "break", "--backend", url, name)
			r.want(t, 0, "break answered y")
			if r.stdout != "freed "+name+"\n" {
				t.Errorf("break answered y: stdout %q", r.stdout)
			}
			if info := inspectJSON(t, url, name); len(info.Holders) != 0 {
				t.Errorf("after break answered y: %+v, want the name free", info)
			}
		})
	}
}

// break of a free name says so, exits 1, and asks nothing.
func TestBreakFree(t *testing.T) {
	for _, kind := range breakable {
		t.Run(kind, func(t *testing.T) {
			url, name := backendURL(t, kind), uniqueName(t)
			for _, args := range [][]string{{"--yes", name}, {name}} {
				r := runLockIn(t, "y\n", append([]string{"break", "--backend", url}, args...)...)
				r.want(t, exitNotHeld, "break of a free name")
				if !strings.Contains(r.stderr, "not held") || strings.Contains(r.stderr, "[y/N]") {
					t.Errorf("break %v of a free name: stderr %q", args, r.stderr)
				}
			}
		})
	}
}

// A holder whose lock run is stopped (SIGSTOP: gone, as far as anyone can
// tell) keeps its Redis lease for the whole TTL; lock break --yes frees it
// at once, a second lock run -n gets it with a larger token, and the
// first, once it runs again, finds the lock lost, kills its group and
// exits 75.
func TestBreakStoppedHolder(t *testing.T) {
	url, name := redisURL(t), uniqueName(t)
	first, pids, dir, p := startGroup(t, url, name, "--kill-after", "200ms") // the default TTL, 30s
	old := mustUint(t, strings.TrimSpace(awaitFile(t, filepath.Join(dir, "token"))))
	testenv.Pause(t, p)
	resumed := false
	t.Cleanup(func() {
		if !resumed {
			testenv.Resume(p)
		}
	})
	runLock(t, "run", "--backend", url, "-n", name, "--", "true").want(t, exitConflict, "lock run -n before the break")

	runLock(t, "break", "--backend", url, "--yes", name).want(t, 0, "break --yes")
	tokFile := filepath.Join(t.TempDir(), "token")
	runLock(t, "run", "--backend", url, "-n", name, "--", "sh", "-c", `echo "$LOCK_TOKEN" > "$0"`, tokFile).want(t, 0, "lock run -n after the break")
	if next := mustUint(t, strings.TrimSpace(awaitFile(t, tokFile))); next <= old {
		t.Errorf("the second holder's token %d is not above the stopped one's %d", next, old)
	}

	resumed = true
	testenv.Resume(p)
	first().want(t, exitLost, "the stopped run, resumed")
	for _, pid := range pids {
		if processAlive(pid) {
			t.Errorf("process %d of the stopped run's group is alive after it exited", pid)
		}
	}
}

// A holder that changes while break asks (the old one released, a new one
// took the name) is not broken: break frees only the holders it showed.
func TestBreakHolderChanged(t *testing.T) {
	url, name := redisURL(t), uniqueName(t)
	_, end := holdLock(t, url, name)
	errFile := filepath.Join(t.TempDir(), "stderr")
	stderr, err := os.Create(errFile)
	if err != nil {
		t.Fatal(err)
	}
	defer stderr.Close()
	cmd, stdout, _ := lockCmd("break", "--backend", url, name)
	cmd.Stderr = stderr
	answer, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	awaitContains(t, errFile, "[y/N]")
	end().want(t, 0, "the first holder")
	holdLock(t, url, name)
	answer.Write([]byte("y\n"))
	answer.Close()
	r := wait(t, cmd, stdout, &bytes.Buffer{}, nil)
	r.want(t, exitRefused, "break whose holder changed")
	awaitContains(t, errFile, "changed", "nothing done")
	if info := inspectJSON(t, url, name); len(info.Holders) != 1 {
		t.Errorf("after the refused break: %+v, want the new holder", info)
	}
}
