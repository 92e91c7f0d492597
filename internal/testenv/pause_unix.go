//go:build unix

package testenv

import (
	"os"
	"syscall"
	"testing"
)

// Pause stops process p (SIGSTOP), as a long GC pause or a frozen VM would:
// it keeps its locks and connections but runs no code until Resume.
func Pause(t testing.TB, p *os.Process) {
	t.Helper()
	if err := p.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
}

// Resume lets a process that Pause stopped run again (SIGCONT).
func Resume(p *os.Process) error { return p.Signal(syscall.SIGCONT) }
