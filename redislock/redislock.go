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
	_ "embed"
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
	meta  string // metaOf the factory's options
	id    string // random: names the factory's channel and seen marks
	// seq numbers the acquire requests the factory sends (see the
	// scripts' doc in scripts.go).
	seq atomic.Uint64
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
	f := &Factory{c: client, cfg: backend.NewConfig(backendName, opts, checkOptions), closing: make(chan struct{}), owner: defaultOwner(), id: semID(newID())}
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
	f.meta = f.metaOf(&f.cfg.Options)
	f.rn.f = f
	f.hub.f = f
	f.hub.own = cmp.Or(f.cfg.Options.KeyPrefix, DefaultKeyPrefix) + "wake:" + f.id
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
	po := &o
	if len(opts) == 0 && err == nil {
		// The factory's own options: its holders need not keep a copy.
		po = &f.cfg.Options
	}
	return backend.Take(ctx, backend.Call{Backend: backendName, Name: name, Locked: ErrLocked, Start: start, Probe: f.probe}, po, err, func(ctx context.Context) (*Holder, time.Duration, error) {
		return f.take(ctx, name, po, !po.NoAutoRenew)
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

// resolve applies a call's options over the factory's.
func (f *Factory) resolve(name string, opts []Option) (lock.Options, error) {
	return f.cfg.Resolve(name, opts, checkOptions)
}

// probe fails when Redis does not answer (the Client interface has no
// PING; SCRIPT EXISTS is as cheap).
func (f *Factory) probe(ctx context.Context) error {
	if err := f.c.ScriptExists(ctx, mutexAcquire.Hash()).Err(); err != nil {
		return fmt.Errorf("redislock: %w", err)
	}
	return nil
}

// take runs attempts (try) through backend.Wait until one gets the lock,
// fails, or with WithWait until ctx ends; wait.go says how a waiter is
// woken. A waiter that ends without the lock leaves the name's queue.
func (f *Factory) take(ctx context.Context, name string, o *lock.Options, renew bool) (*Holder, time.Duration, error) {
	if f.isClosed() {
		return nil, 0, lock.ErrClosed
	}
	a := f.newAttempt(ctx, name, o, renew)
	h, waited, err := backend.Wait(ctx, a.waiting(), a.try)
	if h == nil {
		a.leave()
	}
	return h, waited, err
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
		h.left.Store(false) // freed above, or left to its lease
		h.lose(closedErr)
	}
	f.hub.close()
	f.wg.Wait()
	return nil
}

// releaseMany runs the release script for every holder in one pipeline.
func (f *Factory) releaseMany(ctx context.Context, hs []*Holder) {
	pipeScripts(ctx, f.c, len(hs), func(i int) (*redis.Script, []string, []any) {
		return hs[i].releaseCall()
	})
}
