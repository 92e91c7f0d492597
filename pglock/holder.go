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
	e         *entry
	key       int64
	slot      int
	limit     int
	token     uint64
	pid       uint32
	since     time.Time
	shared    bool // held shared (WithShared)
	hasRow    bool // its acquire wrote a pglock_holders row, which its release deletes
	dismissed bool // out of its name's table; guarded by Factory.mu
	opts      *lock.Options
	ctx       context.Context // the Acquire context without its cancellation, for reports
	state     *backend.State

	relMu  sync.Mutex // one Release at a time
	relErr error      // a clean Release's error; guarded by relMu
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

// admit registers the holder of p, just taken on p's session (whose sem is
// held): in its name's table, on its session, and bounded by WithMaxHold.
func (c *call) admit(p permit) *Holder {
	f, e, o := c.f, c.e, c.o
	h := &Holder{
		f: f, s: p.s, e: e, key: p.key, slot: p.slot, limit: o.Limit(), token: uint64(p.token),
		pid: p.s.pid, since: time.Now(), shared: o.Shared, hasRow: hasRow(o), opts: o,
		ctx: context.WithoutCancel(c.ctx), state: backend.NewState(),
	}
	f.mu.Lock()
	// A holder of this factory on another session may not have taken
	// itself out yet: Postgres gave the lock here, so its release is done.
	if h.shared {
		e.readers[h] = struct{}{}
	} else {
		e.held[h.slot] = h
	}
	e.limit = h.limit
	e.refs++ // the holder's reference
	f.mu.Unlock()
	p.s.add(h)
	h.state.Bound(o, ErrLockLost, nil, h.lose)
	return h
}

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
	res, err := h.unlock(ctx)
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
	case res == releaseNotHeld:
		h.lose(backend.Loss(ErrLockLost, lock.ErrRemoved, "%q was no longer held by its session", h.Name()))
		return h.state.Err()
	}
	h.f.dismiss(h, res == releaseGranted)
	if h.state.End() {
		backend.Report(h.ctx, h.opts, lock.Event{Backend: backendName, Op: lock.OpRelease, Name: h.Name(), Token: h.token, Held: time.Since(h.since), Err: h.relErr})
	}
	return h.relErr
}

// lose ends h with err, a loss the factory found (its session ended, the
// unlock found nothing, or WithMaxHold: it is State.Bound's callback):
// Done closes and the loss is reported first; then what Postgres still
// holds for h is unlocked as Release would (the session closed if that
// fails), and h leaves its name's table.
func (h *Holder) lose(err error) {
	if !h.state.Lose(err) {
		return // released or lost already
	}
	backend.Report(h.ctx, h.opts, lock.Event{Backend: backendName, Op: lock.OpLost, Name: h.Name(), Token: h.token, Held: time.Since(h.since), Err: err})
	res := int32(releaseNotHeld)
	if h.s.holds(h) {
		ctx, cancel := backend.ReleaseContext(h.ctx)
		var uerr error
		res, uerr = h.unlock(ctx)
		cancel()
		if uerr != nil && h.s.holds(h) {
			h.s.forceClose() // unreachable and still claiming it: see Release
		}
	}
	h.f.dismiss(h, res == releaseGranted)
}

// unlock runs h's release statement on its session, unless the session no
// longer has h (released, or gone with the session: h was told). If the
// statement fails or its result is unknown, the session is closed, which
// frees the lock.
func (h *Holder) unlock(ctx context.Context) (res int32, err error) {
	err = h.s.do(ctx, false, func(sc *sessionConn) error {
		if !sc.s.holds(h) {
			return nil
		}
		var (
			pid int32
			err error
		)
		if res, pid, err = h.release(sc); err != nil {
			return sc.fail(sc.wrap(fmt.Sprintf("release of %q", h.Name()), err))
		}
		if err := sc.checkPID(pid); err != nil {
			return err
		}
		sc.s.remove(h)
		return nil
	})
	return res, err
}

// release sends h's release statement: unlock, delete the holder's row,
// NOTIFY if another session waits for the name. sem is held.
func (h *Holder) release(sc *sessionConn) (res, pid int32, err error) {
	st, k := h.f.st, h.e.keys
	var row *int64 // the token of h's row
	if h.hasRow {
		t := int64(h.token)
		row = &t
	}
	if h.limit > 1 {
		sc.s.marks[k.mark]--
		drop := sc.s.marks[k.mark] <= 0
		if drop {
			delete(sc.s.marks, k.mark)
		}
		var ok bool
		err = sc.queryRow(st.semRelease, h.key, k.mark, drop, k.waiters, strconv.FormatInt(k.waiters, 10), row).Scan(&ok, &pid)
		if ok {
			res = releaseDone
		}
		return res, pid, err
	}
	q, qRow := st.mutexRelease, st.mutexReleaseRow
	if h.shared {
		q, qRow = st.sharedRelease, st.sharedReleaseRow
	}
	args := []any{h.key, k.waiters}
	if row != nil {
		q, args = qRow, append(args, *row)
	}
	err = sc.queryRow(q, args...).Scan(&res, &pid)
	return res, pid, err
}

// dismiss takes h out of its name's table (unless a later holder took its
// place already), gives its wait session back, notes a release that
// Postgres granted to a blocked waiter (see queued), and wakes the name's
// first waiter here. Only the first call counts.
func (f *Factory) dismiss(h *Holder, granted bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if h.dismissed {
		return
	}
	h.dismissed = true
	e := h.e
	if h.shared {
		delete(e.readers, h)
	} else if e.held[h.slot] == h {
		delete(e.held, h.slot)
	}
	if granted {
		f.noteBusy(e.keys.mutex)
	}
	f.waits.free(h.s)
	e.wakeFirst()
	f.unrefLocked(e)
}
