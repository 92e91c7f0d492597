//go:build unix

package testenv

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Pause stops process p (SIGSTOP), as a long GC pause or a frozen VM would:
// it keeps its locks and connections but runs no code until Resume. It
// returns once every thread of p has stopped — the signal takes effect
// asynchronously, and a thread still running could answer one more request
// — where /proc shows it (Linux); elsewhere once the signal is sent.
func Pause(t testing.TB, p *os.Process) {
	t.Helper()
	if err := p.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	Eventually(t, 10*time.Second, fmt.Sprintf("process %d stopped after SIGSTOP", p.Pid), func() bool { return stopped(p.Pid) })
}

// stopped reports whether every thread of process pid is stopped (state T
// in /proc/pid/task/*/stat), or true where there is no /proc to tell.
func stopped(pid int) bool {
	stats, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/stat", pid))
	if err != nil || len(stats) == 0 {
		return true
	}
	for _, name := range stats {
		b, err := os.ReadFile(name)
		if err != nil {
			continue // the thread exited
		}
		// "tid (comm) state ...": comm may hold spaces and parentheses.
		s := string(b)
		if f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:]); len(f) == 0 || f[0] != "T" {
			return false
		}
	}
	return true
}

// Resume lets a process that Pause stopped run again (SIGCONT).
func Resume(p *os.Process) error { return p.Signal(syscall.SIGCONT) }
