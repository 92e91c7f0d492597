package main

import (
	"os"
	"os/exec"
	"testing"

	"github.com/ubgo/lock/examples/internal/exampletest"
	"github.com/ubgo/lock/internal/testenv"
)

// TestMain lets the test binary play the demo's children.
func TestMain(m *testing.M) {
	switch testenv.Child() {
	case roleWorker:
		worker()
	case roleFrozen:
		frozenWriter()
	}
	os.Exit(m.Run())
}

// TestDemo runs the demo with real child processes: run returns an error
// for the first claim that does not hold (a killed holder's lock not free
// at once, a paused holder's late write not refused by the fence, two
// waiters inside at once or one never served, more or fewer than three
// inside the semaphore at its peak).
func TestDemo(t *testing.T) {
	err := run(exampletest.Context(t), t.TempDir(), func(role string) *exec.Cmd {
		return testenv.Command(t, role, "TestDemo")
	})
	if err != nil {
		t.Fatal(err)
	}
}
