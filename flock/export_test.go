package flock

// Waiters is how many Acquire calls of this process are waiting, so tests
// can act once a waiter waits.
func Waiters() int64 { return waits.n.Load() }

// Idle reports whether a released descriptor of name in dir is kept.
func Idle(dir, name string) bool {
	idle.Lock()
	defer idle.Unlock()
	e := idle.m[idleKey{dir, name}]
	return e != nil && e.fd != noFile
}
