package flock

import (
	"sync"
	"time"
)

// Idle descriptors. Opening a lock file (a path lookup) is the dearest
// step of an acquire, so a released mutex keeps its descriptor open,
// unlocked, and the next Acquire of the name in this process locks it
// again instead of opening the path. The cache is per process and holds
// at most maxIdle descriptors, so factories (and Locks) that are dropped
// without Close leave no more than that open.
//
// What keeps this as safe as a fresh open:
//   - A descriptor is in the cache or owned by one attempt or holder,
//     never both: two Acquires of one name still lock two open files, and
//     conflict as they do between processes.
//   - After locking a cached descriptor the attempt reads the record as
//     always: a file a sweep marked dead is dropped and the path opened
//     again. A file with no name left (deleted or replaced by hand, or by
//     a /tmp cleaner) is dropped too (sysLinked). One last checked (at
//     its previous acquire) longer than the check interval ago is
//     compared with the file at the path, as a waiter's descriptor is; a
//     file moved away by hand is thus noticed within the check interval,
//     as for a holder.
//   - A release that keeps its descriptor makes no close event, which is
//     how waiters in other processes learn of a release: it keeps it only
//     when no process waits for the name (see board_linux.go).
const maxIdle = 64

type idleKey struct{ dir, name string }

type idleFile struct {
	fd        sysFile
	esc, path string
	board     *board // a reference to the directory's board, or nil
	owner     *Factory
	since     time.Time // when it was last checked: its holder's acquire (a held file is checked by verify)
}

var idle = struct {
	sync.Mutex
	m map[idleKey]idleFile
}{m: map[idleKey]idleFile{}}

// takeIdle hands the idle descriptor of name in dir, if there is one, to
// the caller.
func takeIdle(dir, name string) (idleFile, bool) {
	k := idleKey{dir, name}
	idle.Lock()
	e, ok := idle.m[k]
	if ok {
		delete(idle.m, k)
	}
	idle.Unlock()
	return e, ok
}

// putIdle keeps e, an unlocked descriptor of name, for the next Acquire;
// it closes e instead when its factory is closing or name already has an
// idle descriptor, and the oldest it finds when the cache is full.
func putIdle(dir, name string, e idleFile) {
	k := idleKey{dir, name}
	idle.Lock()
	_, dup := idle.m[k]
	if dup || e.owner.closing.Load() {
		idle.Unlock()
		e.close()
		return
	}
	var out idleFile
	evict := len(idle.m) >= maxIdle
	if evict {
		var victim idleKey
		first := true
		for k2, e2 := range idle.m {
			if first || e2.since.Before(out.since) {
				victim, out, first = k2, e2, false
			}
		}
		delete(idle.m, victim)
	}
	idle.m[k] = e
	idle.Unlock()
	if evict {
		out.close()
	}
}

func (e *idleFile) close() {
	sysClose(e.fd)
	e.board.drop()
}

// closeIdle closes the idle descriptors f put in the cache.
func closeIdle(f *Factory) {
	var out []idleFile
	idle.Lock()
	for k, e := range idle.m {
		if e.owner == f {
			out = append(out, e)
			delete(idle.m, k)
		}
	}
	idle.Unlock()
	for i := range out {
		out[i].close()
	}
}
