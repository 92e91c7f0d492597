//go:build !unix

package testenv

import (
	"os"
	"runtime"
	"testing"
)

// Pause skips the test: this system has no SIGSTOP to freeze a process.
func Pause(t testing.TB, p *os.Process) {
	t.Helper()
	t.Skipf("no SIGSTOP on %s to pause a process", runtime.GOOS)
}

// Resume does nothing: Pause cannot have stopped the process.
func Resume(p *os.Process) error { return nil }
