package flock

// Waiters is how many Acquire calls of this process are waiting, so tests
// can act once a waiter waits.
func Waiters() int64 { return waits.n.Load() }
