package flock

import "github.com/ubgo/lock/backend"

// BoardWaiters is the count of waiters on name's counter in dir's board,
// as every process sees it.
func BoardWaiters(dir, name string) uint32 {
	b := holdBoard(dir)
	if b == nil {
		return 0
	}
	defer b.drop()
	return b.slot(backend.Escape(name)).Load()
}
