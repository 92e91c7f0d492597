package memlock

import (
	"context"
	"time"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/backend"
)

// Holder is one held lock or semaphore permit.
type Holder struct {
	f       *Factory
	name    string
	e       *entry
	opts    *lock.Options
	token   uint64
	state   *backend.State
	ctx     context.Context // the Acquire context without its cancellation, for reports
	since   time.Time
	expires time.Time   // zero without a lease; guarded by f.mu
	stop    func() bool // stops the expiry timer; guarded by f.mu
}

// Token is the fencing token, strictly increasing per name.
func (h *Holder) Token() uint64 { return h.token }

// Done is closed when the lock is released or lost.
func (h *Holder) Done() <-chan struct{} { return h.state.Done() }

// Err is nil while held or after Release, and matches ErrLockLost once lost.
func (h *Holder) Err() error { return h.state.Err() }

// Release gives the lock up. It is idempotent; after a loss it returns an
// error matching ErrLockLost.
func (h *Holder) Release() error {
	h.f.mu.Lock()
	removed := h.f.removeLocked(h, nil)
	h.f.mu.Unlock()
	if removed {
		backend.Report(h.ctx, h.opts, lock.Event{Backend: backendName, Op: lock.OpRelease, Name: h.name, Token: h.token, Held: h.f.clock.Now().Sub(h.since)})
	}
	return h.state.Err()
}

// Extend renews the lease for another TTL. It fails with ErrLockLost once
// the lock is gone; without a TTL it only checks that the lock is held.
func (h *Holder) Extend(ctx context.Context) error {
	start := time.Now()
	h.f.mu.Lock()
	_, held := h.e.holders[h]
	if held && h.stop != nil {
		h.stop()
		h.expires = h.f.clock.Now().Add(h.opts.TTL)
		h.stop = h.f.clock.AfterFunc(h.opts.TTL, h.expire)
	}
	h.f.mu.Unlock()
	var err error
	if !held {
		err = ErrLockLost
	}
	backend.Report(ctx, h.opts, lock.Event{Backend: backendName, Op: lock.OpExtend, Name: h.name, Token: h.token, Latency: time.Since(start), Err: err})
	return err
}

func (h *Holder) expire() {
	h.f.mu.Lock()
	due := !h.expires.IsZero() && !h.f.clock.Now().Before(h.expires)
	removed := due && h.f.removeLocked(h, backend.Loss(ErrLockLost, lock.ErrLeaseExpired, "lease expired"))
	h.f.mu.Unlock()
	if removed {
		h.reportLost()
	}
}

// lose ends h with err, which matches ErrLockLost, and hands its permit
// on: WithMaxHold's end (see backend.State.Bound).
func (h *Holder) lose(err error) {
	h.f.mu.Lock()
	removed := h.f.removeLocked(h, err)
	h.f.mu.Unlock()
	if removed {
		h.reportLost()
	}
}

// reportLost reports h's loss, once its state has recorded it; outside f.mu,
// as an observer may be slow.
func (h *Holder) reportLost() {
	backend.Report(h.ctx, h.opts, lock.Event{Backend: backendName, Op: lock.OpLost, Name: h.name, Token: h.token, Held: h.f.clock.Now().Sub(h.since), Err: h.state.Err()})
}

// Name is the name the lock was acquired under.
func (h *Holder) Name() string { return h.name }
