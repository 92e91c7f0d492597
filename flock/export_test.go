package flock

import (
	"path/filepath"

	"github.com/ubgo/lock/backend"
	"github.com/ubgo/lock/internal/dirwatch"
)

// Waiting is how many Acquires of this process wait on name in dir, so
// tests can act once a waiter waits.
func Waiting(dir, name string) int {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return 0
	}
	return dirwatch.Subscribers(abs, backend.Escape(name))
}

// Watching reports whether this process watches dir for its waiters, or
// is still closing that watch (internal/dirwatch keeps it a while after
// the last waiter left).
func Watching(dir string) bool {
	abs, err := filepath.Abs(dir)
	return err == nil && dirwatch.Watching(abs)
}

// SignalForTest wakes the waiters of the escaped name esc in dir, as a
// release in this process does.
func SignalForTest(dir, esc string) { dirwatch.Signal(dir, esc) }
