// Package redislock is the Redis backend of github.com/ubgo/lock: named
// mutexes, shared locks and semaphores kept in Redis (standalone, Sentinel
// or Cluster, through a go-redis client), with fencing tokens that grow,
// leases renewed in the background, and waiters that queue in Redis and are
// handed the name by the release.
//
// A holder that cannot renew reports the lock lost (Done, Err, WithLock's
// context) before Redis can free it. Redis replicates asynchronously, so a
// failover can lose a lock: pass Holder.Token to the resource where that
// matters. How it works, what is stored where, how fast a loss is noticed
// and when exclusion holds:
// https://github.com/ubgo/lock/blob/main/docs/guides/redislock.md
package redislock

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"reflect"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/ubgo/lock"
	"github.com/ubgo/lock/backend"
)

// Errors, matching the root sentinels with errors.Is.
var (
	ErrLocked   = fmt.Errorf("redislock: %w", lock.ErrLocked)
	ErrLockLost = fmt.Errorf("redislock: %w", lock.ErrLockLost)
)

const backendName = "redislock"

// tokenRetention is how long the token counter outlives the last acquire.
// Tokens never go below the server clock in microseconds, so the counter
// only matters for acquisitions within the same microsecond or while the
// server clock steps back; it need not live forever.
const tokenRetention = 24 * time.Hour

// maxPoll bounds the wait between two attempts of a waiter that receives no
// notification, for a notification lost while pub/sub reconnects.
const maxPoll = 5 * time.Second

// Client is the part of a go-redis client the factory uses: scripts,
// pipelines and pub/sub. *redis.Client, *redis.ClusterClient, *redis.Ring
// and every redis.UniversalClient implement it.
type Client interface {
	redis.Scripter
	Pipeline() redis.Pipeliner
	Subscribe(ctx context.Context, channels ...string) *redis.PubSub
}

var (
	_ Client = (*redis.Client)(nil)
	_ Client = (*redis.ClusterClient)(nil)
	_ Client = (*redis.Ring)(nil)
	_ Client = redis.UniversalClient(nil)
)

// Factory hands out locks kept in Redis. Factories on the same server and
// key prefix contend with each other, whichever process they are in.
// Create one per client and share it: it runs one renewal loop and one
// pub/sub connection for all its locks. Close it when done; without Close
// its goroutines still stop once nothing is held or waited for.
type Factory struct {
	c     Client
	cfg   backend.Config
	owner string // pid@host, the default for WithOwner
	// together: every key seems to live on one server (a *redis.Client,
	// not a cluster or a ring client), so one script may renew many names.
	// Cleared if the server says otherwise (a plain client on a cluster).
	together atomic.Bool

	rn  renewer
	hub hub
	wg  sync.WaitGroup

	mu      sync.Mutex
	closed  bool
	closing chan struct{}
}

// NewFactory returns a factory on client whose options are the defaults for
// every call. A nil client or an invalid option is reported by the first
// Acquire.
func NewFactory(client Client, opts ...Option) *Factory {
	f := &Factory{c: client, cfg: backend.NewConfig(backendName, opts, checkOptions), closing: make(chan struct{}), owner: defaultOwner()}
	if isNil(client) {
		f.cfg.Fail(fmt.Errorf("%w: nil Redis client", lock.ErrInvalidOption))
	}
	if f.replicaAck() > 0 {
		switch client.(type) {
		case *redis.Client, *redis.ClusterClient:
		default:
			f.cfg.Fail(fmt.Errorf("%w: WithReplicaAck needs a *redis.Client or *redis.ClusterClient, not %T", lock.ErrInvalidOption, client))
		}
	}
	f.rn.f = f
	f.hub.f = f
	f.hub.own = cmp.Or(f.cfg.Options.KeyPrefix, DefaultKeyPrefix) + "wake:" + semID(newID())
	_, together := client.(*redis.Client)
	f.together.Store(together)
	return f
}

// Err returns the error of the factory's options (or a nil client), which
// every Acquire also returns; nil when the factory is usable. Check it at
// start-up.
func (f *Factory) Err() error { return f.cfg.Err }

func isNil(c Client) bool {
	if c == nil {
		return true
	}
	v := reflect.ValueOf(c)
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface, reflect.Map, reflect.Slice, reflect.Func, reflect.Chan:
		return v.IsNil()
	}
	return false
}

func defaultOwner() string {
	host, _ := os.Hostname()
	return strconv.Itoa(os.Getpid()) + "@" + host
}

// Acquire takes name. On contention it returns an error matching ErrLocked
// at once, or with WithWait waits until the lock is free or ctx ends. The
// lease renews in the background unless WithAutoRenew(false) is given;
// then call Extend.
func (f *Factory) Acquire(ctx context.Context, name string, opts ...Option) (*Holder, error) {
	start := time.Now()
	o, err := f.resolve(name, opts)
	return backend.Take(ctx, backend.Call{Backend: backendName, Name: name, Locked: ErrLocked, Start: start, Probe: f.probe}, &o, err, func(ctx context.Context) (*Holder, time.Duration, error) {
		return f.take(ctx, name, &o, !o.NoAutoRenew)
	})
}

// WithLock runs fn while holding name; see lock.WithLock. fn's context is
// cancelled if the lock is lost.
func (f *Factory) WithLock(ctx context.Context, name string, fn func(ctx context.Context) error, opts ...Option) error {
	return lock.WithLock(ctx, f.AsLocker(opts...), name, fn)
}

// AsLocker returns the factory as a lock.Locker whose every Acquire uses
// opts. Its holders are *Holder values (so lock.Extender works on them).
func (f *Factory) AsLocker(opts ...Option) lock.Locker {
	return backend.Locker(&f.cfg, opts, f.Acquire)
}

// lease holds what an acquisition needs of its call's options.
type lease struct {
	ttl    time.Duration
	margin time.Duration // the holder gives up this long before the server's expiry
	limit  int
	meta   string // owner and metadata as stored for Inspect
	shared bool   // WithShared: a reader, kept like a semaphore permit
	wait   bool   // WithWait
}

// permit reports whether the holder is a member of the name's slots (a
// semaphore permit or a reader) rather than the mutex's value.
func (ls lease) permit() bool { return ls.limit > 1 || ls.shared }

// resolve applies a call's options over the factory's.
func (f *Factory) resolve(name string, opts []Option) (lock.Options, error) {
	return f.cfg.Resolve(name, opts, checkOptions)
}

// leaseOf turns resolved options into the lease of one acquisition.
func (f *Factory) leaseOf(o *lock.Options) lease {
	ttl := cmp.Or(o.TTL, DefaultTTL).Truncate(time.Millisecond) // what Redis stores
	// A string and a map of strings always marshal.
	m, _ := json.Marshal(meta{Owner: cmp.Or(o.Owner, f.owner), Metadata: o.Metadata})
	return lease{ttl: ttl, margin: ttl/10 + 2*time.Millisecond, limit: o.Limit(), meta: string(m), shared: o.Shared, wait: o.Wait}
}

// probe fails when Redis does not answer (the Client interface has no
// PING; SCRIPT EXISTS is as cheap).
func (f *Factory) probe(ctx context.Context) error {
	if err := f.c.ScriptExists(ctx, mutexAcquire.Hash()).Err(); err != nil {
		return fmt.Errorf("redislock: %w", err)
	}
	return nil
}

// attempt is the outcome of one run of the acquire script.
type attempt struct {
	status int // 1 acquired, 0 locked, -1 limit mismatch
	token  uint64
	pttl   time.Duration
	limit  int
	sent   time.Time
}

// take runs the acquire script until it gets the lock, or with WithWait
// until ctx ends (see wait.go for how a waiter is woken). Every attempt of
// one call uses the same id.
func (f *Factory) take(ctx context.Context, name string, o *lock.Options, renew bool) (*Holder, time.Duration, error) {
	if f.isClosed() {
		return nil, 0, lock.ErrClosed
	}
	k := keysFor(o.KeyPrefix, name)
	ls := f.leaseOf(o)
	id := newID()
	var w *waiter
	if o.Wait && !ls.permit() {
		// In the hub before the first look, so that a grant is not missed.
		w = f.hub.addMutex(k.channel, id)
		w.leave = func() { f.leaveQueue(ctx, k, id, ls, w) }
		defer w.Close()
	}
	// Others in this process wait already for the semaphore: queue behind
	// them rather than overtake them. The release that frees a permit
	// wakes the first of them, and each in turn.
	queued := o.Wait && ls.permit() && f.hub.waiting(k.channel) > 0
	return backend.Wait(ctx, backend.Waiting{
		Wait: o.Wait, Locked: ErrLocked, Closed: f.closing,
		// A release grants a mutex or wakes a semaphore's first waiter;
		// every look that finds the name held bounds the next by a lease
		// (the attempt's hint), so a holder or granted waiter that died is
		// noticed within one; maxPoll caps it.
		MinPoll: maxPoll, MaxPoll: maxPoll,
		Queued: queued,
		Subscribe: func() (backend.Subscription, error) {
			if w != nil {
				w.skip = w.joined
				return w, nil
			}
			var ahead int
			w, ahead = f.hub.join(k.channel)
			if queued && ahead == 0 {
				signal(w) // those it queued behind are gone: its turn
			}
			return w, nil
		},
	}, func() (*Holder, time.Duration, error) {
		if err := ctx.Err(); err != nil {
			return nil, 0, err
		}
		a, err := f.look(ctx, k, id, ls, w)
		switch {
		case err != nil:
			return nil, 0, err
		case a.status == 0:
			return nil, a.pttl, ErrLocked
		case a.status < 0:
			return nil, 0, fmt.Errorf("redislock: %w: %q is held with limit %d, caller asked for %d", lock.ErrLimitMismatch, name, a.limit, ls.limit)
		}
		h := f.newHolder(ctx, name, k, id, ls, o, a, renew)
		if !f.rn.add(h) {
			h.Release()
			return nil, 0, lock.ErrClosed
		}
		if f.replicaAck() > 0 {
			if err := f.confirm(ctx, h); err != nil {
				h.Release()
				return nil, 0, err
			}
		}
		if w != nil {
			w.acquired = true
		}
		return h, 0, nil
	})
}

// unreachable has a cluster client reload its map of the cluster after a
// call failed on the network: go-redis otherwise keeps sending a failed
// master's slots to it until its periodic reload (a minute by default;
// go-redis issue #3979), long after a replica took over.
func (f *Factory) unreachable(err error) {
	var ne net.Error
	if cc, ok := f.c.(*redis.ClusterClient); ok && errors.As(err, &ne) {
		cc.ReloadState(context.Background())
	}
}

// try runs the acquire script once. A mutex waiter passes its factory's
// channel ch to join the name's queue.
func (f *Factory) try(ctx context.Context, k keys, id string, ls lease, ch string) (attempt, error) {
	a := attempt{sent: time.Now()}
	kl := []string{k.lock, k.token, k.slots, k.permits, k.tombOf(id)}
	var cmd *redis.Cmd
	switch {
	case ls.shared:
		wait := "0"
		if ls.wait {
			wait = "1"
		}
		cmd = sharedAcquire.Run(ctx, f.c, append(kl, k.rwait), semID(id), ls.ttl.Milliseconds(), ls.meta, tokenRetention.Milliseconds(), wait)
	case ls.limit == 1:
		cmd = mutexAcquire.Run(ctx, f.c, kl, id, ls.ttl.Milliseconds(), ls.meta, tokenRetention.Milliseconds(), ch)
	default:
		cmd = semAcquire.Run(ctx, f.c, kl, semID(id), ls.ttl.Milliseconds(), ls.limit, ls.meta, tokenRetention.Milliseconds())
	}
	res, err := cmd.Result()
	if err != nil {
		f.unreachable(err)
		f.abandon(ctx, k, id, ls)
		return a, fmt.Errorf("redislock: acquire: %w", err)
	}
	arr, ok := res.([]any)
	if !ok { // acquired: the reply is the token
		tok, err := toUint(res)
		if err != nil || tok == 0 {
			return a, fmt.Errorf("redislock: acquire: bad reply %v", res)
		}
		a.status, a.token = 1, tok
		return a, nil
	}
	if len(arr) < 2 {
		return a, fmt.Errorf("redislock: acquire: unexpected reply %v", res)
	}
	st, _ := toInt(arr[0])
	a.status = int(st)
	switch a.status {
	case 0:
		ms, _ := toInt(arr[1])
		a.pttl = time.Duration(ms) * time.Millisecond
		if ms < 0 {
			// A key without expiry (an operator's SET): when it ends is
			// unknown, so poll at the longest interval.
			a.pttl = maxPoll
		}
	case -1:
		lim, _ := toInt(arr[1])
		a.limit = int(lim)
	case -2: // the id has a tombstone: not from a live attempt
		return a, fmt.Errorf("redislock: acquire: attempt already given up")
	default:
		return a, fmt.Errorf("redislock: acquire: unexpected reply %v", res)
	}
	return a, nil
}

// abandon cleans up after an attempt that failed without a reply: the
// script may have run, or run in part, and its reply been lost, or it may
// still be on its way. So it releases the lock by the attempt's id (unique,
// so this cannot touch anyone else's), which also writes the id's
// tombstone. It runs in the background, bounded by its own timeout: the
// caller's ctx may be over, and a server that does not answer would
// otherwise keep the caller waiting for that long. Close waits for it.
func (f *Factory) abandon(ctx context.Context, k keys, id string, ls lease) {
	f.mu.Lock()
	tracked := !f.closed // Close may be waiting on wg already
	if tracked {
		f.wg.Add(1)
	}
	f.mu.Unlock()
	go func() {
		if tracked {
			defer f.wg.Done()
		}
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), min(ls.ttl, backend.ReleaseTimeout))
		defer cancel()
		s, keys, args := f.releaseCall(k, id, ls)
		s.Run(cctx, f.c, keys, args...)
	}()
}

func (f *Factory) isClosed() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.closed
}

// Close releases every lock the factory holds (they report ErrLockLost
// and lock.ErrClosed), fails waiting and later Acquire calls with
// lock.ErrClosed, and stops the factory's goroutines and pub/sub
// connection; it waits for the cleanup of failed acquire attempts, each
// bounded by the TTL and by backend.ReleaseTimeout. It does not close the
// Redis client.
func (f *Factory) Close() error {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return nil
	}
	f.closed = true
	close(f.closing)
	f.mu.Unlock()

	held := f.rn.drain()
	if len(held) > 0 {
		ctx, cancel := backend.ReleaseContext(context.Background())
		f.releaseMany(ctx, held)
		cancel()
	}
	closedErr := fmt.Errorf("%w: %w", ErrLockLost, lock.ErrClosed)
	for _, h := range held {
		h.lose(closedErr)
	}
	f.hub.close()
	f.wg.Wait()
	return nil
}

// releaseMany runs the release script for every holder in one pipeline.
func (f *Factory) releaseMany(ctx context.Context, hs []*Holder) {
	pipeScripts(ctx, f.c, len(hs), func(i int) (*redis.Script, []string, []any) {
		h := hs[i]
		return f.releaseCall(h.k, h.id, h.ls)
	})
}

// confirm waits until the lock h was just given reached the factory's
// WithReplicaAck replicas: an extend and a WAIT in one pipeline on the
// name's primary (extendOnce). Replication keeps the primary's order, so
// the acknowledgement of the extend covers the acquire or hand-off before
// it.
func (f *Factory) confirm(ctx context.Context, h *Holder) error {
	ctx, cancel := context.WithTimeout(ctx, h.ls.ttl/3)
	defer cancel()
	v, err := h.extendOnce(ctx)
	switch {
	case err != nil:
		return fmt.Errorf("redislock: acquire %q: %w", h.name, err)
	case v != 1:
		return fmt.Errorf("redislock: acquire %q: %w before it reached the replicas", h.name, ErrLockLost)
	}
	return nil
}
