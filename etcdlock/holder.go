package etcdlock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/backend"
)

// Holder is one held lock or semaphore permit: one key in etcd.
type Holder struct {
	f     *Factory
	w     *watcher
	s     *session
	name  string
	key   string
	claim claim
	token uint64 // the key's create revision
	opts  *lock.Options
	state *backend.State
	ctx   context.Context // the Acquire context without its cancellation, for reports
	since time.Time

	detachOnce  sync.Once
	releaseOnce sync.Once
	releaseErr  error
	releasing   atomic.Bool // Release's delete is on its way: its reply decides
}

// Token is the fencing token: the etcd revision at which this holder's key
// was created, strictly increasing across the cluster.
func (h *Holder) Token() uint64 { return h.token }

// Done is closed when the lock is released or lost.
func (h *Holder) Done() <-chan struct{} { return h.state.Done() }

// Err is nil while held or after Release, and matches ErrLockLost once lost.
func (h *Holder) Err() error { return h.state.Err() }

// Name is the name the lock was acquired under.
func (h *Holder) Name() string { return h.name }

// Key is the etcd key that is this lock; deleting it (etcdctl del) takes the
// lock away.
func (h *Holder) Key() string { return h.key }

// Lease is the id of the lease the key is attached to; revoking it takes
// away every lock on it.
func (h *Holder) Lease() clientv3.LeaseID { return h.s.id }

// Release gives the lock up by deleting its key, if the key is still the one
// this holder created. It is idempotent and bounded by
// backend.ReleaseTimeout whatever the Acquire context; after a loss it
// returns an error matching ErrLockLost at once, without a request. If etcd cannot be reached the key
// is deleted later in the background, or goes with its lease.
func (h *Holder) Release() error {
	h.releaseOnce.Do(func() { h.releaseErr = h.release() })
	if err := h.state.Err(); err != nil {
		return err
	}
	return h.releaseErr
}

func (h *Holder) release() error {
	if h.state.Err() != nil {
		// Lost: the key is gone, or goes with a lease that is no longer
		// renewed, most likely because etcd is out of reach; a delete
		// would only wait for it.
		return ErrLockLost
	}
	ctx, cancel := backend.ReleaseContext(h.ctx)
	defer cancel()
	h.releasing.Store(true)
	h.w.untrack(h.claim) // our own deletion is not a loss
	ok, err := h.f.del(ctx, h.key, int64(h.token))
	switch {
	case err != nil:
		h.s.addOrphan(h.claim, int64(h.token))
		err = fmt.Errorf("etcdlock: release %q: %w", h.name, err)
	case !ok:
		h.lose(backend.Loss(ErrLockLost, lock.ErrRemoved, "the key was no longer this holder's at release"))
		return ErrLockLost
	default:
		h.f.unclaim(h.claim)
	}
	h.detach()
	if h.state.End() {
		backend.Report(h.ctx, h.opts, lock.Event{Backend: backendName, Op: lock.OpRelease, Name: h.name, Token: h.token, Held: time.Since(h.since), Err: err})
	}
	return err
}

// Extend renews the lease now, which pushes the expiry one TTL into the
// future for every lock on the same lease, and checks that the key is still
// there. It returns an error matching ErrLockLost once the lock is gone.
// With WithAutoRenew(false) it is the only renewal.
func (h *Holder) Extend(ctx context.Context) error {
	start := time.Now()
	err := h.extend(ctx)
	backend.Report(ctx, h.opts, lock.Event{Backend: backendName, Op: lock.OpExtend, Name: h.name, Token: h.token, Latency: time.Since(start), Err: err})
	return err
}

func (h *Holder) extend(ctx context.Context) error {
	if h.state.Ended() {
		return ErrLockLost
	}
	if err := h.s.keepAlive(ctx); err != nil {
		if h.state.Ended() {
			return ErrLockLost
		}
		return fmt.Errorf("etcdlock: extend %q: %w", h.name, err)
	}
	resp, err := h.f.cli.Get(ctx, h.key, clientv3.WithKeysOnly())
	if err != nil {
		return fmt.Errorf("etcdlock: extend %q: %w", h.name, err)
	}
	if len(resp.Kvs) == 0 || resp.Kvs[0].CreateRevision != int64(h.token) {
		if h.releasing.Load() {
			// The release's delete may be what this read saw. Whatever
			// its reply, the holder ends with it, lost only if the key
			// was no longer this holder's.
			return ErrLockLost
		}
		h.w.untrack(h.claim) // gone: nothing to delete
		h.lose(backend.Loss(ErrLockLost, lock.ErrRemoved, "the key was no longer this holder's at extend"))
	}
	if h.state.Ended() {
		return ErrLockLost
	}
	return nil
}

// lose ends the holder with err, a loss matching ErrLockLost: found by
// the watch (its key went), its lease (not renewed in time, revoked, or
// ended by Close), Release or Extend (the key was no longer its), or
// WithMaxHold (lose is State.Bound's callback). It reports the loss,
// stops the holder's renewal, and deletes its key if it may still be
// there: not once the watch or Release has let go of it, nor on a dead
// lease, which takes the key with it (and etcd may be why it died).
// WithMaxHold leaves a Release on its way to end the holder: its delete
// frees the key.
func (h *Holder) lose(err error) {
	if h.releasing.Load() && errors.Is(err, lock.ErrMaxHold) {
		return
	}
	there := h.w.untrack(h.claim) && h.s.alive()
	if h.state.Lose(err) {
		backend.Report(h.ctx, h.opts, lock.Event{Backend: backendName, Op: lock.OpLost, Name: h.name, Token: h.token, Held: time.Since(h.since), Err: err})
	}
	if there {
		h.f.remove(h.s, h.claim, int64(h.token))
	} else {
		// The key is gone, or goes with the lease; an acquire that meets
		// it before then skips the name.
		h.f.unclaim(h.claim)
	}
	h.detach()
}

// detach drops the holder's references to its session and watch.
func (h *Holder) detach() {
	h.detachOnce.Do(func() {
		h.s.removeHolder(h)
		h.f.unrefSession(h.s)
		h.f.unrefWatch(h.w)
	})
}
