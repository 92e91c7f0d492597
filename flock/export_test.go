package flock

import "github.com/ubgo/lock/backend"

// Waiters is how many Acquire calls of this process are waiting, so tests
// can act once a waiter waits.
func Waiters() int64 { return waits.n.Load() }

// BoardWaiters is the count of waiters on name's counter in dir's board
// (Linux), as every process sees it.
func BoardWaiters(dir, name string) uint32 {
	b := holdBoard(dir)
	if b == nil {
		return 0
	}
	defer b.drop()
	return b.slot(backend.Escape(name)).Load()
}

// Idle reports whether a released descriptor of name in dir is kept.
func Idle(dir, name string) bool {
	idle.Lock()
	defer idle.Unlock()
	_, ok := idle.m[idleKey{dir, name}]
	return ok
}
