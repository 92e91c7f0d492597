package pglock

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/backend"
)

// Holder is one held lock or semaphore permit.
type Holder struct {
	f         *Factory
	s         *session
	gen       uint64 // the session's generation it was taken on
	e         *entry
	key       int64
	slot      int
	limit     int
	token     uint64
	pid       uint32
	since     time.Time
	published bool // its acquire wrote a pglock_holders row, which its release deletes
	shared    bool // held shared (WithShared)
	unheld    bool // taken out of its name's table; guarded by Factory.mu
	opts      *lock.Options
	ctx       context.Context // the Acquire context without its cancellation, for reports
	state     *backend.State

	relMu  sync.Mutex
	relErr error
}

// Token is the fencing token: strictly increasing per name, taken from a
// durable sequence in the statement that took the lock.
func (h *Holder) Token() uint64 { return h.token }

// Done is closed when the lock is released or lost.
func (h *Holder) Done() <-chan struct{} { return h.state.Done() }

// Err is nil while held or after Release, and matches ErrLockLost once
// lost.
func (h *Holder) Err() error { return h.state.Err() }

// Name is the name the lock was acquired under.
func (h *Holder) Name() string { return h.e.name }

// BackendPID is the pid of the Postgres backend (the lock session) that
// holds the lock, as pg_locks and pg_stat_activity show it.
func (h *Holder) BackendPID() uint32 { return h.pid }

// Release gives the lock up in one statement on its session. It is
// idempotent and runs on a context of its own (backend.ReleaseContext).
// If the unlock fails or its result is unknown, the session is closed, which
// frees the lock on the server (and makes the other holders on that session
// lose theirs). After a loss Release returns an error matching ErrLockLost.
func (h *Holder) Release() error {
	h.relMu.Lock()
	defer h.relMu.Unlock()
	if h.state.Ended() {
		if err := h.state.Err(); err != nil {
			return err
		}
		return h.relErr
	}
	ctx, cancel := backend.ReleaseContext(h.ctx)
	defer cancel()
	held, handed, err := h.unlockOnSession(ctx)
	switch {
	case h.state.Ended(): // lost before or while releasing
		if err := h.state.Err(); err != nil {
			return err
		}
		return h.relErr
	case err != nil && !h.s.holds(h):
		// The session was closed to free the lock: released, with an error.
		h.relErr = err
	case err != nil:
		// The session could not be reached within the release timeout
		// and still claims the lock: close it so the lock cannot leak.
		h.s.forceClose()
		h.relErr = err
		return err
	case !held:
		h.lose(fmt.Errorf("%w: %q was no longer held by its session", ErrLockLost, h.Name()))
		return h.state.Err()
	}
	if handed {
		h.f.contended(h.e.keys.mutex)
	}
	h.unhold()
	if h.state.End() {
		backend.Report(h.ctx, h.opts, lock.Event{Backend: backendName, Op: lock.OpRelease, Name: h.Name(), Token: h.token, Held: time.Since(h.since), Err: h.relErr})
	}
	return h.relErr
}

// unlockOnSession runs the release statement on h's session, unless the
// session ended since (the holder was told). If the unlock fails or its
// result is unknown, the session is closed, which frees the lock.
func (h *Holder) unlockOnSession(ctx context.Context) (held, handed bool, err error) {
	err = h.s.do(ctx, false, func(sc *sessionConn) error {
		if sc.s.gen != h.gen {
			return nil // the session ended; the holder was told
		}
		var pid int32
		var err error
		held, handed, pid, err = h.unlock(sc)
		if err != nil {
			// Unknown or failed: close the session, which frees the lock.
			return sc.fail(sc.wrap(fmt.Sprintf("release of %q", h.Name()), err))
		}
		if err := sc.checkPID(pid); err != nil {
			return err
		}
		sc.s.remove(h)
		return nil
	})
	return held, handed, err
}

// endHold is WithMaxHold's end (see backend.State.Bound): h is lost with
// err at once, then unlocked on its session as Release would, the session
// closed if that fails, so the lock does not outlive the bound.
func (h *Holder) endHold(err error) {
	h.relMu.Lock()
	defer h.relMu.Unlock()
	if !h.state.Lose(err) {
		return // released or lost already
	}
	backend.Report(h.ctx, h.opts, lock.Event{Backend: backendName, Op: lock.OpLost, Name: h.Name(), Token: h.token, Held: time.Since(h.since), Err: err})
	ctx, cancel := backend.ReleaseContext(h.ctx)
	defer cancel()
	_, handed, uerr := h.unlockOnSession(ctx)
	if uerr != nil && h.s.holds(h) {
		h.s.forceClose() // unreachable and still claiming it: see Release
	}
	if handed {
		h.f.contended(h.e.keys.mutex)
	}
	h.unhold()
}

// unlock runs the release statement: unlock, delete the holder's row if it
// has one, NOTIFY if another session waits for the name. held is false if
// the session did not hold the key. sem is held.
// handed is true when Postgres gave a mutex straight to a blocked waiter.
func (h *Holder) unlock(sc *sessionConn) (held, handed bool, pid int32, err error) {
	st, k := h.f.st, h.e.keys
	if h.limit > 1 {
		sc.s.marks[k.mark]--
		drop := sc.s.marks[k.mark] <= 0
		if drop {
			delete(sc.s.marks, k.mark)
		}
		var tok *int64
		if h.published {
			t := int64(h.token)
			tok = &t
		}
		err = sc.queryRow(st.semRelease, h.key, k.mark, drop, k.waiters, strconv.FormatInt(k.waiters, 10), tok).Scan(&held, &pid)
		return held, false, pid, err
	}
	var res int32
	rel, relPub := st.mutexRelease, st.mutexReleasePub
	if h.shared {
		rel, relPub = st.sharedRelease, st.sharedReleasePub
	}
	if h.published {
		err = sc.queryRow(relPub, h.key, k.waiters, int64(h.token)).Scan(&res, &pid)
	} else {
		err = sc.queryRow(rel, h.key, k.waiters).Scan(&res, &pid)
	}
	return res != 0, res&4 != 0, pid, err
}

// unhold takes the holder out of its name's table (unless a later holder
// took its place already), gives its wait session back, and wakes the
// name's local waiters.
func (h *Holder) unhold() {
	h.f.mu.Lock()
	first := !h.unheld
	if first {
		h.unheld = true
		if h.shared {
			delete(h.e.readers, h)
		} else if h.e.held[h.slot] == h {
			delete(h.e.held, h.slot)
		}
		h.s.claimed = false
		h.f.unrefLocked(h.e)
	}
	h.f.mu.Unlock()
	if first {
		h.f.lis.signal(h.e.keys.waiters)
	}
}

// lose records that the lock is gone: Done closes, Err matches
// ErrLockLost, and local waiters are woken.
func (h *Holder) lose(err error) {
	h.unhold()
	if h.state.Lose(err) {
		backend.Report(h.ctx, h.opts, lock.Event{Backend: backendName, Op: lock.OpLost, Name: h.Name(), Token: h.token, Held: time.Since(h.since), Err: err})
	}
}
