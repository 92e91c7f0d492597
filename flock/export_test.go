package flock

import "github.com/ubgo/lock/internal/dirwatch"

// Waiters is how many Acquire calls of this process are waiting, so tests
// can act once a waiter waits.
func Waiters() int64 { return waiters.Load() }

// SignalForTest wakes the waiters of the escaped name esc in dir, as a
// release in this process does.
func SignalForTest(dir, esc string) { dirwatch.Signal(dir, esc) }
