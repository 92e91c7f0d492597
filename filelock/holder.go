//go:build unix

package filelock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/backend"
)

// errNotOurs: the marker is gone or carries another holder's nonce.
var errNotOurs = errors.New("filelock: marker is not ours")

// refreshWait bounds how long a background refresh waits for the name's
// guard before trying again later.
const refreshWait = 250 * time.Millisecond

// never is a time no schedule reaches.
var never = time.Now().Add(100 * 365 * 24 * time.Hour)

// Holder is one held lock or semaphore permit: one marker file.
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
	ctx, cancel := backend.ReleaseContext(h.ctx)
	defer cancel()
	err := h.removeLocked(ctx, nil)
	if errors.Is(err, errNotOurs) {
		h.loseLocked(fmt.Errorf("%w: marker %s was removed or taken over", ErrLockLost, h.path))
		return h.state.Err()
	}
	h.f.unregister(h)
	if h.state.End() {
		h.opts.Report(h.ctx, lock.Event{Backend: backendName, Op: lock.OpRelease, Name: h.name, Token: h.token, Held: time.Since(h.since), Err: err})
	}
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
	h.opts.Report(ctx, lock.Event{Backend: backendName, Op: lock.OpExtend, Name: h.name, Token: h.token, Latency: time.Since(start), Err: err})
	return err
}

func (h *Holder) extendLocked(ctx context.Context) error {
	if h.state.Ended() {
		if err := h.state.Err(); err != nil {
			return err
		}
		return fmt.Errorf("%w: released", ErrLockLost)
	}
	if !time.Now().Before(h.deadline) {
		h.expireLocked()
		return h.state.Err()
	}
	err := h.refreshLocked(ctx)
	if errors.Is(err, errNotOurs) {
		h.loseLocked(fmt.Errorf("%w: marker %s was removed or taken over", ErrLockLost, h.path))
		return h.state.Err()
	}
	return err
}

// scheduleLocked sets the deadlines that follow a refresh at now.
func (h *Holder) scheduleLocked(now time.Time) {
	h.deadline = now.Add(h.ttl - margin(h.ttl))
	h.nextRefresh = now.Add(refreshEvery(h.ttl))
	h.nextCheck = now.Add(checkEvery(h.ttl))
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
	if err := unix.Rename(tmp, h.path); err != nil {
		return fmt.Errorf("filelock: refresh marker: %w", err)
	}
	h.m = m
	h.scheduleLocked(now)
	return nil
}

// oursLocked reports errNotOurs unless the marker carries our nonce.
func (h *Holder) oursLocked() error {
	m, _, err := readMarker(h.path)
	switch {
	case err == unix.ENOENT:
		return errNotOurs
	case err != nil:
		return fmt.Errorf("filelock: read marker: %w", err)
	case m == nil || m.Nonce != h.m.Nonce:
		return errNotOurs
	}
	return nil
}

// removeLocked removes the marker under the guard if it is still ours.
// before, if set, runs under the guard just before the removal: a lock that
// ends by loss is reported lost before anyone can take the name.
func (h *Holder) removeLocked(ctx context.Context, before func()) error {
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
	if before != nil {
		before()
	}
	if err := unix.Unlink(h.path); err != nil && err != unix.ENOENT {
		return fmt.Errorf("filelock: remove marker: %w", err)
	}
	hubFor(h.dir).signal(h.esc)
	return nil
}

// tick is the loop's visit: it ends a lease that ran out, refreshes an
// auto-renewing marker when due, or reads the marker back to notice a
// takeover. It returns when it next needs a visit.
func (h *Holder) tick() time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.state.Ended() {
		return never
	}
	now := time.Now()
	if !now.Before(h.deadline) {
		h.expireLocked()
		return never
	}
	switch {
	case h.renew && !now.Before(h.nextRefresh):
		// A guard that stays taken (its holder stopped inside it) must not
		// stall the refreshes of the factory's other locks.
		until := now.Add(refreshWait)
		if h.deadline.Before(until) {
			until = h.deadline
		}
		ctx, cancel := context.WithDeadline(h.ctx, until)
		start := time.Now()
		err := h.refreshLocked(ctx)
		cancel()
		if errors.Is(err, errNotOurs) {
			h.loseLocked(fmt.Errorf("%w: marker %s was removed or taken over", ErrLockLost, h.path))
			return never
		}
		if err != nil {
			// Try again soon; the deadline ends the lock if this goes on.
			h.nextRefresh = now.Add(checkEvery(h.ttl))
			h.opts.Report(h.ctx, lock.Event{Backend: backendName, Op: lock.OpExtend, Name: h.name, Token: h.token, Latency: time.Since(start), Err: err})
		}
	case !now.Before(h.nextCheck):
		if err := h.oursLocked(); errors.Is(err, errNotOurs) {
			h.loseLocked(fmt.Errorf("%w: marker %s was removed or taken over", ErrLockLost, h.path))
			return never
		}
		h.nextCheck = now.Add(checkEvery(h.ttl))
	}
	next := h.deadline
	if h.nextCheck.Before(next) {
		next = h.nextCheck
	}
	if h.renew && h.nextRefresh.Before(next) {
		next = h.nextRefresh
	}
	return next
}

// expireLocked ends a lock whose lease ran out before it was refreshed: the
// holder learns first, then the marker, if still ours, is removed so others
// need not wait for the margin to pass.
func (h *Holder) expireLocked() {
	lose := func() { h.loseLocked(fmt.Errorf("%w: not refreshed within the stale window (%v)", ErrLockLost, h.ttl)) }
	// Briefly: this runs on the factory's loop. A marker left behind is
	// taken over as stale by the next Acquire anyway.
	ctx, cancel := context.WithTimeout(h.ctx, refreshWait)
	defer cancel()
	h.removeLocked(ctx, lose)
	lose() // if the marker was not ours any more, or could not be removed
}

func (h *Holder) loseLocked(err error) {
	h.f.unregister(h)
	if h.state.Lose(err) {
		h.opts.Report(h.ctx, lock.Event{Backend: backendName, Op: lock.OpLost, Name: h.name, Token: h.token, Held: time.Since(h.since), Err: err})
	}
}

// closeByFactory ends the lock when its factory closes.
func (h *Holder) closeByFactory() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.state.Ended() {
		return nil
	}
	lose := func() { h.loseLocked(fmt.Errorf("%w: factory closed", ErrLockLost)) }
	ctx, cancel := backend.ReleaseContext(h.ctx)
	defer cancel()
	err := h.removeLocked(ctx, lose)
	lose()
	if err != nil && !errors.Is(err, errNotOurs) {
		return err
	}
	return nil
}
