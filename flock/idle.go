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

// idleFile is the cache's entry for a name: its idle descriptor, if it
// has one. Entries stay while their descriptor is out with a holder, so
// that the common cycle, take then put back, only looks the name up.
type idleFile struct {
	fd        sysFile // noFile while none is idle
	esc, path string
	board     *board // a reference to the directory's board, or nil
	owner     *Factory
	since     time.Time // when it was last checked: its holder's acquire (a held file is checked by verify)
}

var idle = struct {
	sync.Mutex
	m map[idleKey]*idleFile // at most maxIdle entries
}{m: map[idleKey]*idleFile{}}

// takeIdle hands the idle descriptor of name in dir, if there is one, to
// the caller.
func takeIdle(dir, name string) (idleFile, bool) {
	idle.Lock()
	defer idle.Unlock()
	e := idle.m[idleKey{dir, name}]
	if e == nil || e.fd == noFile {
		return idleFile{}, false
	}
	out := *e
	e.fd, e.board = noFile, nil
	return out, true
}

// putIdle keeps in, an unlocked descriptor of name, for the next Acquire;
// it closes in instead when its factory is closing or name already has an
// idle descriptor. A name new to a full cache takes the place of one
// without an idle descriptor, or else of the least recently checked one,
// whose descriptor it closes.
func putIdle(dir, name string, in idleFile) {
	k := idleKey{dir, name}
	idle.Lock()
	e := idle.m[k]
	if e != nil && e.fd != noFile || in.owner.closing.Load() {
		idle.Unlock()
		in.close()
		return
	}
	var out idleFile
	evicted := false
	if e == nil {
		if len(idle.m) >= maxIdle {
			out, evicted = evictIdle()
		}
		e = new(idleFile)
		idle.m[k] = e
	}
	*e = in
	idle.Unlock()
	if evicted {
		out.close()
	}
}

// evictIdle removes an entry from the full cache: one with no idle
// descriptor if there is one, else the least recently checked, whose
// descriptor the caller closes. The caller holds idle's lock.
func evictIdle() (idleFile, bool) {
	var victim idleKey
	var ve *idleFile
	for k, e := range idle.m {
		if e.fd == noFile {
			delete(idle.m, k)
			return idleFile{}, false
		}
		if ve == nil || e.since.Before(ve.since) {
			victim, ve = k, e
		}
	}
	delete(idle.m, victim)
	return *ve, true
}

func (e *idleFile) close() {
	sysClose(e.fd)
	e.board.drop()
}

// closeIdle closes the idle descriptors f put in the cache, and forgets
// f's entries.
func closeIdle(f *Factory) {
	var out []idleFile
	idle.Lock()
	for k, e := range idle.m {
		if e.owner != f {
			continue
		}
		if e.fd != noFile {
			out = append(out, *e)
		}
		delete(idle.m, k)
	}
	idle.Unlock()
	for i := range out {
		out[i].close()
	}
}
