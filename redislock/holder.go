package redislock

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/ubgo/lock"
	"github.com/ubgo/lock/backend"
)

// Holder is one held lock or semaphore permit.
type Holder struct {
	f     *Factory
	name  string
	k     keys
	id    string // random, unique per acquisition: what Release and Extend compare (see newID)
	ls    lease
	token uint64
	seq   uint64 // the number of the request that took the lock (see Factory.seq)
	opts  *lock.Options
	ctx   context.Context // the Acquire context without its cancellation, for reports
	start time.Time
	state *backend.State
	relMu sync.Mutex // one Release at a time

	// left: the holder's key may still be in Redis. Cleared once Redis
	// answered for it (a release, or a renewal or Extend that found it
	// gone) or Close freed it; a loss removes what is left (free).
	left atomic.Bool

	tracking // the renewer's, guarded by f.rn.mu
}

// newHolder returns the holder of a's acquire, which Redis confirmed with r.
func (f *Factory) newHolder(a *attempt, r reply) *Holder {
	h := &Holder{
		f: f, name: a.name, k: a.k, id: a.id, ls: a.ls.held(), token: r.token, seq: a.seq, opts: a.o,
		ctx: context.WithoutCancel(a.ctx), start: r.sent, state: backend.NewState(), tracking: tracking{auto: a.renew},
	}
	h.left.Store(true)
	h.confirmLocked(r.sent)
	return h
}

// releaseContext bounds a release. h.ctx is not cancelled with the
// caller's context already.
func (h *Holder) releaseContext() (context.Context, context.CancelFunc) {
	return context.WithTimeout(h.ctx, backend.ReleaseTimeout)
}

// runRelease runs the release script: 1 if it removed this holder's lock
// or permit, 0 if it was no longer there.
func (h *Holder) runRelease(ctx context.Context) *redis.Cmd {
	sc, keys, args := h.releaseCall()
	return sc.Run(ctx, h.f.c, keys, args...)
}

// releaseCall is h's release script, keys and arguments. The seen mark its
// acquire raised lives two TTLs: after a hold of more than half a TTL the
// release raises it again, so that it outlives the release by a TTL.
func (h *Holder) releaseCall() (*redis.Script, []string, []any) {
	var seq uint64
	if time.Since(h.start) > h.ls.ttl/2 {
		seq = h.seq
	}
	return h.f.releaseCall(h.k, h.id, h.ls, seq, "")
}

// confirmLocked records that the server accepted an acquire or extend sent
// at sent: the server's lease then runs until at least sent+ttl. f.rn.mu is
// held (or h is not yet shared).
func (h *Holder) confirmLocked(sent time.Time) {
	if d := sent.Add(h.ls.ttl - h.ls.margin); d.After(h.deadline) {
		h.deadline = d
	}
	if by := sent.Add(h.ls.ttl / 3); by.After(h.renewBy) {
		h.renewBy = by
		h.renewAt = sent.Add(h.ls.ttl / 6)
	}
}

// Token is the fencing token: greater than zero and strictly larger than
// the token of every earlier holder of the name.
func (h *Holder) Token() uint64 { return h.token }

// Done is closed when the lock is released or lost.
func (h *Holder) Done() <-chan struct{} { return h.state.Done() }

// Err is nil while held or after Release, and matches ErrLockLost once lost.
func (h *Holder) Err() error { return h.state.Err() }

// Name is the name the lock was acquired under.
func (h *Holder) Name() string { return h.name }

// Key is the Redis key that holds the lock, for operators and for scripts
// of your own (its hash tag is the name's). For a mutex it is a string
// whose value begins with the holder's random id; for a semaphore permit
// (WithMaxConcurrent above 1) it is the sorted set of the name's permit
// ids, scored by expiry, in which this holder is one member, so it stays
// while other permits are held; a shared holder (WithShared) is a member
// of the same set, of the name's readers. It is never the key of another
// name.
func (h *Holder) Key() string { return h.k.lock }

// Release gives the lock up, if it is still this holder's: a lock that was
// lost is never freed for its successor. It is idempotent, runs on its own
// bounded context, and after a loss returns an error matching ErrLockLost.
// If Redis cannot be reached it returns that error and may be called
// again; the lock then frees itself when its lease runs out.
func (h *Holder) Release() error {
	h.relMu.Lock()
	defer h.relMu.Unlock()
	if h.state.Ended() {
		if h.left.Load() {
			h.free() // what the loss could not remove
		}
		return h.state.Err()
	}
	h.f.rn.stopRenewing(h)
	start := time.Now()
	ctx, cancel := h.releaseContext()
	defer cancel()
	v, err := h.runRelease(ctx).Int64()
	found := h.f.rn.released(h, err == nil)
	switch {
	case err != nil:
		err = fmt.Errorf("redislock: release %q: %w", h.name, err)
		backend.Report(h.ctx, h.opts, lock.Event{Backend: backendName, Op: lock.OpRelease, Name: h.name, Token: h.token, Latency: time.Since(start), Err: err})
		if found == nil {
			return err // still held as far as it knows: its deadline decides
		}
		// A loss was found while this release was on its way, and the
		// release cannot say whether it was the one that removed the
		// lock. The finding stands, as it would have without the release.
		h.lose(found)
	case v != 1:
		h.left.Store(false)
		h.lose(backend.Loss(ErrLockLost, lock.ErrRemoved, "no longer held at release"))
	default:
		h.left.Store(false)
		if h.state.End() {
			backend.Report(h.ctx, h.opts, lock.Event{Backend: backendName, Op: lock.OpRelease, Name: h.name, Token: h.token, Latency: time.Since(start), Held: time.Since(h.start)})
		}
	}
	return h.state.Err()
}

// Extend renews the lease for another TTL, in one round trip. Once the
// lock is lost (or released) it returns an error matching ErrLockLost and
// touches nothing. Other errors (Redis unreachable) leave the holder as it
// was: it is lost when its lease deadline passes unconfirmed.
func (h *Holder) Extend(ctx context.Context) error {
	start := time.Now()
	err := h.extend(ctx)
	backend.Report(ctx, h.opts, lock.Event{Backend: backendName, Op: lock.OpExtend, Name: h.name, Token: h.token, Latency: time.Since(start), Err: err})
	return err
}

func (h *Holder) extend(ctx context.Context) error {
	if h.state.Ended() {
		if err := h.state.Err(); err != nil {
			return err
		}
		return fmt.Errorf("%w: released", ErrLockLost)
	}
	sent := time.Now()
	v, err := h.extendOnce(ctx)
	if err != nil {
		return fmt.Errorf("redislock: extend %q: %w", h.name, err)
	}
	if v != 1 {
		h.left.Store(false)
		h.lose(backend.Loss(ErrLockLost, lock.ErrRemoved, "no longer held at extend"))
	} else if !h.f.rn.confirm(h, sent) {
		// The holder gave the lock up (lost by its deadline, released or
		// closed) while the extend was on its way: do not keep it.
		h.free()
	} else {
		return nil
	}
	if err := h.state.Err(); err != nil {
		return err
	}
	return fmt.Errorf("%w: released", ErrLockLost)
}

// lose ends the holder with err, which matches ErrLockLost, whoever found
// the loss: the lease deadline (expire), WithMaxHold (it is the callback
// given to State.Bound), a renewal, Extend, Release or Close. Done closes
// and renewal stops in one step (an Extend from then on returns err),
// unless a Release is on its way, whose reply then decides (see
// tracking.releasing). The loss is reported once, and a key it may have
// left is removed if it is still the holder's, so that a successor need
// not wait out the lease.
func (h *Holder) lose(err error) {
	if !h.f.rn.lose(h, err) {
		return
	}
	backend.Report(h.ctx, h.opts, lock.Event{Backend: backendName, Op: lock.OpLost, Name: h.name, Token: h.token, Held: time.Since(h.start), Err: err})
	if h.left.Load() {
		h.free()
	}
}

// expire runs when the holder's lease deadline passed without a confirmed
// acquire or renewal. The holder is lost at once — Done closes while the
// server still holds the key for at least the margin — and then removes
// the key if Redis can be reached.
func (h *Holder) expire() {
	defer h.f.wg.Done()
	h.f.rn.mu.Lock()
	cause := h.renewErr
	h.f.rn.mu.Unlock()
	err := backend.Loss(ErrLockLost, lock.ErrLeaseExpired, "lease not confirmed within %v", h.ls.ttl-h.ls.margin)
	if cause != nil {
		// The renewal failures were logged at Debug: the loss's one line
		// says why.
		err = fmt.Errorf("%w: last renewal: %v", err, cause)
	}
	h.lose(err)
}

// free removes the holder's key, if it is still the holder's.
func (h *Holder) free() {
	ctx, cancel := h.releaseContext()
	defer cancel()
	if h.runRelease(ctx).Err() == nil {
		h.left.Store(false)
	}
}

// extendOnce runs h's extend script once and returns its reply (1: still
// h's). With WithReplicaAck it runs on the name's primary followed by a
// WAIT, and fails with ErrNotReplicated if too few replicas acknowledged.
func (h *Holder) extendOnce(ctx context.Context) (int64, error) {
	if ack := h.f.replicaAck(); ack > 0 {
		return pipeScriptsAcked(ctx, h.f.primary(ctx, h.k.lock), 1, func(int) (*redis.Script, []string, []any) {
			return extendCall(h.k, h.id, h.ls)
		}, ack)[0].Int64()
	}
	sc, keys, args := extendCall(h.k, h.id, h.ls)
	return sc.Run(ctx, h.f.c, keys, args...).Int64()
}
