//go:build unix

package filelock

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/backend"
	"github.com/ubgo/lock/internal/dirwatch"
)

// errNotOurs: the marker is gone or carries another holder's nonce.
var errNotOurs = errors.New("filelock: marker is not ours")

// Holder is one held lock or semaphore permit: one marker file.
//
// Two timers of its own drive it. expiry fires at the deadline and ends the
// lock without I/O or h.mu, so neither a refresh stuck on the disk nor a
// name whose guard is stuck can delay it; visits refreshes and reads back
// the marker, and waits for nothing but this holder's name.
type Holder struct {
	f     *Factory
	name  string
	esc   string
	dir   string
	path  string
	token uint64
	ttl   time.Duration
	renew bool
	opts  *lock.Options
	state *backend.State
	ctx   context.Context // the Acquire context without its cancellation, for reports
	since time.Time

	mu          sync.Mutex // serializes this holder's disk work; guards the fields below
	m           marker     // the marker as last written
	deadline    time.Time  // declare the lock lost at this time unless refreshed
	nextRefresh time.Time
	nextCheck   time.Time
	expiry      *time.Timer // at deadline: expire
	visits      *time.Timer // at the next refresh or check: visit
	over        bool        // no more disk work: released, or lost and cleaned up
}

// margin is how long before its lease runs out a holder that could not
// refresh declares the lock lost, so that it knows before anyone can take
// the marker over.
func margin(ttl time.Duration) time.Duration { return min(ttl/10, 2*time.Second) }

// checkEvery is how often a held marker is read back to notice a takeover
// or removal.
func checkEvery(ttl time.Duration) time.Duration {
	return min(max(ttl/8, 10*time.Millisecond), time.Second)
}

// refreshEvery is how often auto-renewing holders refresh: three tries
// before the lease runs out.
func refreshEvery(ttl time.Duration) time.Duration { return ttl / 3 }

// newHolder is the holder of a new marker at path, in slot (-1 for
// <esc>.lock), with token: not yet written.
func (c *call) newHolder(path string, slot int, token uint64) *Holder {
	id := self()
	now := time.Now()
	h := &Holder{
		f: c.f, name: c.name, esc: c.esc, dir: c.dir, path: path, token: token, ttl: c.ttl, renew: c.renew,
		opts: c.o, state: backend.NewState(), ctx: context.WithoutCancel(c.ctx), since: now,
	}
	h.m = marker{
		Name: c.name, Token: token, Nonce: newNonce(), PID: id.pid, Start: id.start, StartTicks: id.ticks,
		Host: id.host, BootID: id.bootID, PIDNS: id.pidNS, TimeNS: id.timeNS,
		Acquired: now, Refreshed: now, Expires: now.Add(c.ttl), StaleAfter: c.ttl,
		Limit: c.limit, Slot: max(slot, 0), Shared: c.o.Shared, Owner: c.o.Owner, Meta: maps.Clone(c.o.Metadata),
	}
	return h
}

// admit adds h to the factory's holders, which Close ends, and starts its
// timers and WithMaxHold's bound; lock.ErrClosed when the factory is
// closed.
func (f *Factory) admit(h *Holder) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	f.mu.Lock()
	closed := f.closed
	if !closed {
		f.held[h] = struct{}{}
	}
	f.mu.Unlock()
	if closed {
		return lock.ErrClosed
	}
	h.startLocked(h.since)
	h.state.Bound(h.opts, ErrLockLost, nil, h.lose)
	return nil
}

// forget drops h from the factory's holders.
func (f *Factory) forget(h *Holder) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.held, h)
}

// Token is the fencing token, strictly increasing per name.
func (h *Holder) Token() uint64 { return h.token }

// Done is closed when the lock is released or lost.
func (h *Holder) Done() <-chan struct{} { return h.state.Done() }

// Err is nil while held or after Release, and matches ErrLockLost once lost.
func (h *Holder) Err() error { return h.state.Err() }

// Name is the name the lock was acquired under.
func (h *Holder) Name() string { return h.name }

// Path is the marker file of this lock (or permit).
func (h *Holder) Path() string { return h.path }

// Release removes the marker if it is still this holder's. It is idempotent
// and runs on its own bounded context. After a loss (the marker was taken
// over or removed) it returns an error matching ErrLockLost and removes
// nothing. If the marker cannot be removed (an I/O error), Release returns
// the error, stops refreshing, and the marker frees itself once its stale
// window passes.
func (h *Holder) Release() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.state.Ended() {
		return h.state.Err()
	}
	h.finishLocked()
	ctx, cancel := backend.ReleaseContext(h.ctx)
	defer cancel()
	err := h.removeLocked(ctx)
	if errors.Is(err, errNotOurs) {
		h.declare(h.takenOver())
		return h.state.Err()
	}
	if !h.state.End() {
		return h.state.Err() // the deadline fired meanwhile
	}
	backend.Report(h.ctx, h.opts, lock.Event{Backend: backendName, Op: lock.OpRelease, Name: h.name, Token: h.token, Held: time.Since(h.since), Err: err})
	return err
}

// Extend refreshes the marker: its lease runs for another stale window from
// now. It fails with ErrLockLost once the marker is no longer this
// holder's, or once the holder's own deadline (a margin before the lease
// runs out) has passed.
func (h *Holder) Extend(ctx context.Context) error {
	start := time.Now()
	h.mu.Lock()
	err := h.extendLocked(ctx)
	h.mu.Unlock()
	backend.Report(ctx, h.opts, lock.Event{Backend: backendName, Op: lock.OpExtend, Name: h.name, Token: h.token, Latency: time.Since(start), Err: err})
	return err
}

func (h *Holder) extendLocked(ctx context.Context) error {
	if h.state.Ended() {
		if err := h.state.Err(); err != nil {
			return err
		}
		return fmt.Errorf("%w: released", ErrLockLost)
	}
	if !time.Now().Before(h.deadline) { // its timer is about to fire
		h.declare(h.expired())
		h.dropLocked()
		h.finishLocked()
		return h.state.Err()
	}
	err := h.refreshLocked(ctx)
	if errors.Is(err, errNotOurs) {
		h.declare(h.takenOver())
		h.finishLocked()
		return h.state.Err()
	}
	return err
}

// startLocked sets the schedule of a marker written at now and starts the
// holder's timers.
func (h *Holder) startLocked(now time.Time) {
	h.scheduleLocked(now)
	h.expiry = time.AfterFunc(time.Until(h.deadline), h.expire)
	h.visits = time.AfterFunc(time.Until(h.nextVisitLocked()), h.visit)
}

// scheduleLocked sets the deadlines that follow a refresh at now.
func (h *Holder) scheduleLocked(now time.Time) {
	h.deadline = now.Add(h.ttl - margin(h.ttl))
	h.nextRefresh = now.Add(refreshEvery(h.ttl))
	h.nextCheck = now.Add(checkEvery(h.ttl))
}

func (h *Holder) nextVisitLocked() time.Time {
	if h.renew && h.nextRefresh.Before(h.nextCheck) {
		return h.nextRefresh
	}
	return h.nextCheck
}

// finishLocked ends the holder's disk work: its timers stop, and a timer
// that already fired finds over set and does nothing.
func (h *Holder) finishLocked() {
	h.over = true
	h.expiry.Stop()
	h.visits.Stop()
	h.f.forget(h)
}

// refreshLocked rewrites the marker with a new refresh time, only if it is
// still ours: the new content is written and synced first, then, under the
// guard, checked for and put in place by rename(2), which replaces it whole.
// Keeping the sync outside the guard keeps the guard's window short.
func (h *Holder) refreshLocked(ctx context.Context) error {
	now := time.Now()
	m := h.m
	m.Refreshed, m.Expires = now, now.Add(h.ttl)
	tmp := tempPath(h.dir, h.esc, newNonce()[:16])
	if err := writeTemp(tmp, m.encode()); err != nil {
		return fmt.Errorf("filelock: refresh marker: %w", err)
	}
	defer unix.Unlink(tmp) // after a successful rename there is nothing to remove
	g, err := lockGuard(ctx, h.dir, h.esc)
	if err != nil {
		return err
	}
	defer g.unlock()
	if err := h.oursLocked(); err != nil {
		return err
	}
	if h.state.Ended() {
		return h.state.Err() // the deadline passed while the refresh was on its way
	}
	if err := unix.Rename(tmp, h.path); err != nil {
		return fmt.Errorf("filelock: refresh marker: %w", err)
	}
	h.m = m
	if !h.expiry.Stop() {
		// The deadline fired after all: the lock is lost, and expire
		// removes the marker once we let go of h.mu.
		return h.expired()
	}
	h.scheduleLocked(now)
	h.expiry.Reset(time.Until(h.deadline))
	return nil
}

// oursLocked reports errNotOurs unless the marker carries our nonce.
func (h *Holder) oursLocked() error {
	m, _, err := readMarker(h.path)
	switch {
	case errors.Is(err, unix.ENOENT):
		return errNotOurs
	case err != nil:
		return fmt.Errorf("filelock: read marker: %w", err)
	case m == nil || m.Nonce != h.m.Nonce:
		return errNotOurs
	}
	return nil
}

// removeLocked removes the marker under the guard if it is still ours.
func (h *Holder) removeLocked(ctx context.Context) error {
	g, err := lockGuard(ctx, h.dir, h.esc)
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return errNotOurs // the directory is gone, and our marker with it
		}
		return err
	}
	defer g.unlock()
	if err := h.oursLocked(); err != nil {
		return err
	}
	if err := unix.Unlink(h.path); err != nil && err != unix.ENOENT {
		return fmt.Errorf("filelock: remove marker: %w", err)
	}
	dirwatch.Signal(h.dir, h.esc)
	return nil
}

// discard removes the marker of a holder that was never handed out, if it
// is still its own, and returns err, why it was not.
func (h *Holder) discard(ctx context.Context, err error) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.over = true
	ctx, cancel := backend.ReleaseContext(ctx)
	defer cancel()
	h.removeLocked(ctx)
	return err
}

// dropLocked removes the marker of a lock that was lost, if it is still
// ours, so that others need not wait for its lease; no longer than until
// the lease ends, when anyone may take it over anyway.
func (h *Holder) dropLocked() {
	ctx, cancel := context.WithDeadline(h.f.closing, h.m.Expires)
	defer cancel()
	h.removeLocked(ctx)
}

// visit runs on the visits timer: it refreshes an auto-renewing marker when
// due, or reads the marker back to notice a takeover, and sets the timer
// for the next visit.
func (h *Holder) visit() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.over || h.state.Ended() {
		return
	}
	now := time.Now()
	switch {
	case h.renew && !now.Before(h.nextRefresh):
		// A refresh that ends after the deadline is of no use: the lock is
		// lost by then. Close ends it too.
		ctx, cancel := context.WithDeadline(h.f.closing, h.deadline)
		err := h.refreshLocked(ctx)
		cancel()
		if errors.Is(err, errNotOurs) {
			h.declare(h.takenOver())
			h.finishLocked()
			return
		}
		if h.state.Ended() {
			return // expire, waiting for h.mu, cleans up
		}
		if err != nil {
			// Try again soon; the deadline ends the lock if this goes on,
			// and its loss gets the one Warn line.
			h.nextRefresh = now.Add(checkEvery(h.ttl))
			backend.ReportRetried(h.ctx, h.opts, lock.Event{Backend: backendName, Op: lock.OpExtend, Name: h.name, Token: h.token, Latency: time.Since(now), Err: err})
		}
	case !now.Before(h.nextCheck):
		if err := h.oursLocked(); errors.Is(err, errNotOurs) {
			h.declare(h.takenOver())
			h.finishLocked()
			return
		}
		h.nextCheck = now.Add(checkEvery(h.ttl))
	}
	h.visits.Reset(time.Until(h.nextVisitLocked()))
}

// expire runs on the expiry timer, at the deadline: the holder learns at
// once — no I/O, no h.mu, so a refresh stalled on the disk or on a guard
// cannot delay it — and then the marker, if still ours, is removed.
func (h *Holder) expire() { h.lose(h.expired()) }

// lose ends the lock with err: the holder is told at once, without I/O
// (declare), then its marker is removed if still ours. The deadline's
// end, and WithMaxHold's (the callback of backend.State.Bound).
func (h *Holder) lose(err error) {
	h.declare(err)
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.over {
		return
	}
	h.dropLocked()
	h.finishLocked()
}

func (h *Holder) expired() error {
	return backend.Loss(ErrLockLost, lock.ErrLeaseExpired, "not refreshed within the stale window (%v)", h.ttl)
}

func (h *Holder) takenOver() error {
	return backend.Loss(ErrLockLost, lock.ErrRemoved, "marker %s was removed or taken over", h.path)
}

// declare marks the lock lost and reports it; it needs no lock and does
// no I/O.
func (h *Holder) declare(err error) {
	if h.state.Lose(err) {
		backend.Report(h.ctx, h.opts, lock.Event{Backend: backendName, Op: lock.OpLost, Name: h.name, Token: h.token, Held: time.Since(h.since), Err: err})
	}
}

// closeByFactory ends the lock when its factory closes: lost at once, then
// the marker removed if still ours.
func (h *Holder) closeByFactory() error {
	h.declare(fmt.Errorf("%w: %w", ErrLockLost, lock.ErrClosed))
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.over {
		return nil
	}
	defer h.finishLocked()
	ctx, cancel := backend.ReleaseContext(h.ctx)
	defer cancel()
	if err := h.removeLocked(ctx); err != nil && !errors.Is(err, errNotOurs) {
		return err
	}
	return nil
}
