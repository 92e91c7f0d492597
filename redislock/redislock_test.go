package redislock

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/ubgo/lock"
	"github.com/ubgo/lock/backend"
	"github.com/ubgo/lock/internal/testenv"
	"github.com/ubgo/lock/locktest"
)

func TestConformance(t *testing.T) {
	// Two factories on two clients, used in turn: lockers contend like two
	// processes would.
	runConformance(t, newClient(t), newClient(t))
}

// runConformance runs locktest.Run on two factories, one on each client.
func runConformance(t *testing.T, a, b redis.UniversalClient) {
	fs := [2]*Factory{
		NewFactory(a, WithTTL(3*time.Second), WithKeyPrefix(testPrefix), WithLogger(nil)),
		NewFactory(b, WithTTL(3*time.Second), WithKeyPrefix(testPrefix), WithLogger(nil)),
	}
	t.Cleanup(func() { fs[0].Close(); fs[1].Close() })
	var n atomic.Uint32
	// Every factory of the run, for counting waiters.
	var mu sync.Mutex
	all := fs[:]
	locktest.Run(t, locktest.Backend{
		New: func(t testing.TB, opts ...lock.Option) lock.Locker {
			return fs[n.Add(1)%2].AsLocker(opts...)
		},
		ErrLocked:   ErrLocked,
		ErrLockLost: ErrLockLost,
		Wait:        true,
		Semaphore:   true,
		Extend:      true,
		Shared:      true,
		TTL:         time.Second,
		Inspector:   func(testing.TB) lock.Inspector { return fs[0] },
		Lister:      func(testing.TB) lock.Lister { return fs[1] },
		// The keys hold no name: a hashed one is listed escaped.
		ListEscapesLongNames: true,
		Dial: func(t testing.TB, addr string, opts ...lock.Option) lock.Locker {
			c := redis.NewClient(&redis.Options{Addr: addr})
			f := NewFactory(c, WithKeyPrefix(testPrefix), WithLogger(nil))
			t.Cleanup(func() { f.Close(); c.Close() })
			return f.AsLocker(opts...)
		},
		Lose: func(t testing.TB, h lock.Holder) {
			if err := a.Del(context.Background(), h.(*Holder).k.lock).Err(); err != nil {
				t.Errorf("deleting the lock key: %v", err)
			}
		},
		Waiting: func(name string) int {
			mu.Lock()
			defer mu.Unlock()
			n := 0
			for _, f := range all {
				n += f.hub.waiting(keysFor(testPrefix, name).channel)
			}
			return n
		},
		NewFactory: func(t testing.TB, opts ...lock.Option) locktest.Factory {
			f := NewFactory(a, append([]lock.Option{WithTTL(3 * time.Second), WithKeyPrefix(testPrefix), WithLogger(nil)}, opts...)...)
			t.Cleanup(func() { f.Close() })
			mu.Lock()
			all = append(all, f)
			mu.Unlock()
			return f
		},
		Breaker: func(testing.TB) locktest.Breaker { return fs[0] },
		Fence:   func(testing.TB) lock.Fence { return NewFence(b, WithKeyPrefix(testPrefix)) },
		// The queue is in the lock's value: New's lockers, of two
		// factories, queue in it like processes.
		FIFO: func(t testing.TB, opts ...lock.Option) lock.Locker {
			return fs[n.Add(1)%2].AsLocker(opts...)
		},
		Name: "redislock",
	})
}

func TestBadInput(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		what string
		f    *Factory
		opts []Option
	}{
		{"nil client", NewFactory(nil), nil},
		{"typed nil client", NewFactory((*redis.Client)(nil)), nil},
		{"factory TTL below minimum", NewFactory(newClient(t), WithTTL(time.Millisecond)), nil},
		{"call TTL below minimum", NewFactory(newClient(t)), []Option{WithTTL(9 * time.Millisecond)}},
		{"negative TTL", NewFactory(newClient(t)), []Option{WithTTL(-time.Second)}},
		{"zero TTL", NewFactory(newClient(t), WithTTL(0)), nil},
		{"zero limit", NewFactory(newClient(t)), []Option{WithMaxConcurrent(0)}},
	} {
		h, err := tc.f.Acquire(ctx, uniq(t, "x"), tc.opts...)
		if err == nil {
			h.Release()
			t.Errorf("%s: Acquire succeeded", tc.what)
			continue
		}
		if !errors.Is(err, lock.ErrInvalidOption) {
			t.Errorf("%s: %v; want ErrInvalidOption", tc.what, err)
		}
	}
}

// No key is ever written without an expiry, and every key of a name shares
// one hash tag.
func TestKeysExpireAndShareHashTag(t *testing.T) {
	rdb := newClient(t)
	f := NewFactory(rdb, WithKeyPrefix(testPrefix), WithLogger(nil), WithTTL(time.Minute))
	defer f.Close()
	ctx := ctxT(t)
	name := uniq(t, "a{b}:c/d")
	m, err := f.Acquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	sem := name + "-sem"
	s1, err := f.Acquire(ctx, sem, WithMaxConcurrent(2), WithMetadata("job", "7"))
	if err != nil {
		t.Fatal(err)
	}
	keys, err := rdb.Keys(ctx, testPrefix+"{"+backend.Escape(name)+"*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 7 { // lock, token, took marker; and lock, permits, token, took marker of the semaphore
		t.Fatalf("keys %v; want 7", keys)
	}
	for _, k := range keys {
		ttl, err := rdb.PTTL(ctx, k).Result()
		if err != nil || ttl <= 0 {
			t.Errorf("key %q: PTTL %v, %v; every key must expire", k, ttl, err)
		}
		if strings.Count(k, "{") != 1 || strings.Count(k, "}") != 1 {
			t.Errorf("key %q: the escaped name must not add braces", k)
		}
	}
	slot := func(k string) string { return k[strings.IndexByte(k, '{') : strings.IndexByte(k, '}')+1] }
	if slot(m.k.lock) != slot(m.k.token) || slot(m.k.lock) != slot(m.k.queue) || slot(m.k.lock) != slot(m.k.channel) {
		t.Errorf("keys of one name do not share a hash tag: %+v", m.k)
	}
	m.Release()
	s1.Release()
}

func TestModeMismatch(t *testing.T) {
	f := NewFactory(newClient(t), WithKeyPrefix(testPrefix), WithLogger(nil))
	defer f.Close()
	ctx := ctxT(t)
	name := uniq(t, "x")
	m, err := f.Acquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Acquire(ctx, name, WithMaxConcurrent(2)); !errors.Is(err, lock.ErrLimitMismatch) {
		t.Fatalf("semaphore on a held mutex: %v; want ErrLimitMismatch", err)
	}
	m.Release()
	s, err := f.Acquire(ctx, name, WithMaxConcurrent(2))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Acquire(ctx, name); !errors.Is(err, lock.ErrLimitMismatch) {
		t.Fatalf("mutex on a held semaphore: %v; want ErrLimitMismatch", err)
	}
	s.Release()
}

func TestInspectShowsOwnerAndMetadata(t *testing.T) {
	f := NewFactory(newClient(t), WithKeyPrefix(testPrefix), WithLogger(nil), WithTTL(time.Minute))
	defer f.Close()
	ctx := ctxT(t)
	for _, limit := range []int{1, 3} {
		name := uniq(t, "x")
		h, err := f.Acquire(ctx, name, WithMaxConcurrent(limit), WithOwner("job-42"), WithMetadata("trace", "abc:def"))
		if err != nil {
			t.Fatal(err)
		}
		before := time.Now()
		info, err := f.Inspect(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if info.Limit != limit || len(info.Holders) != 1 {
			t.Fatalf("limit %d: Inspect = %+v", limit, info)
		}
		hi := info.Holders[0]
		if hi.Token != h.Token() || hi.Owner != "job-42" || hi.Metadata["trace"] != "abc:def" {
			t.Errorf("limit %d: holder info %+v", limit, hi)
		}
		if hi.Expires.Before(before) || hi.Expires.After(before.Add(time.Minute+time.Second)) || hi.Since.IsZero() {
			t.Errorf("limit %d: Since %v Expires %v", limit, hi.Since, hi.Expires)
		}
		h.Release()
	}
	h, err := f.Acquire(ctx, uniq(t, "default-owner"))
	if err != nil {
		t.Fatal(err)
	}
	defer h.Release()
	info, _ := f.Inspect(ctx, h.Name())
	if len(info.Holders) != 1 || !strings.Contains(info.Holders[0].Owner, "@") {
		t.Errorf("default owner: %+v; want pid@host", info)
	}
}

// A lost token counter never makes tokens go back.
func TestTokensSurviveLostCounter(t *testing.T) {
	rdb := newClient(t)
	f := testFactory(t, rdb)
	ctx := ctxT(t)
	name := uniq(t, "x")
	var last uint64
	for i := 0; i < 5; i++ {
		h, err := f.Acquire(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if h.Token() <= last {
			t.Fatalf("token %d after %d", h.Token(), last)
		}
		last = h.Token()
		h.Release()
		if i%2 == 0 {
			rdb.Del(ctx, h.k.token)
		} else {
			rdb.Set(ctx, h.k.token, "garbage", time.Minute)
		}
	}
}

// A token counter ahead of the server clock (two acquires in one
// microsecond, a clock that stepped back) raises the token above it, and
// the holder's stored value carries the raised token.
func TestTokenAboveCounterAheadOfClock(t *testing.T) {
	rdb := newClient(t)
	f := testFactory(t, rdb)
	ctx := ctxT(t)
	name := uniq(t, "x")
	k := keysFor(testPrefix, name)
	ahead := uint64(time.Now().Add(time.Hour).UnixMicro())
	rdb.Set(ctx, k.token, strconv.FormatUint(ahead, 10), time.Minute)
	t.Cleanup(func() { rdb.Del(ctx0(), k.token) })
	h, err := f.Acquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Release()
	if h.Token() != ahead+1 {
		t.Fatalf("token %d, want %d", h.Token(), ahead+1)
	}
	info, err := f.Inspect(ctx, name)
	if err != nil || len(info.Holders) != 1 || info.Holders[0].Token != ahead+1 {
		t.Fatalf("Inspect = %+v, %v; want the token %d", info, err, ahead+1)
	}
	if got, _ := rdb.Get(ctx, k.token).Uint64(); got != ahead+1 {
		t.Fatalf("counter %d, want %d", got, ahead+1)
	}
}

// An acquire script that runs twice for one acquisition (the client
// retried after a lost reply) hands out the same token, and one that
// fails half-way leaves no lock behind.
func TestAcquireRetriedAndFailed(t *testing.T) {
	rdb := newClient(t)
	f := testFactory(t, rdb)
	ctx := ctxT(t)
	name := uniq(t, "x")
	a := f.newAttempt(ctx, name, &f.cfg.Options, false)
	k := a.k
	r1, err1 := a.run("")
	r2, err2 := a.run("")
	if err1 != nil || err2 != nil || r1.status != 1 || r2.status != 1 || r1.token != r2.token {
		t.Fatalf("first %+v %v, again %+v %v; want the same token twice", r1, err1, r2, err2)
	}
	other := f.newAttempt(ctx, name, &f.cfg.Options, false)
	if r3, err := other.run(""); err != nil || r3.status != 0 || r3.retry <= 0 {
		t.Fatalf("another id: %+v %v; want locked with the lease left", r3, err)
	}
	s, keys, args := f.releaseCall(k, a.id, a.ls, 0, "")
	if v, err := s.Run(ctx, rdb, keys, args...).Int(); v != 1 || err != nil {
		t.Fatalf("release: %v %v", v, err)
	}

	// A counter key of the wrong type fails the script after the lock
	// was set; the client removes it.
	rdb.Del(ctx, k.token)
	rdb.RPush(ctx, k.token, "x")
	t.Cleanup(func() { rdb.Del(ctx0(), k.token) })
	if _, err := f.Acquire(ctx, name); err == nil {
		t.Fatal("Acquire with a broken counter succeeded")
	}
	f.Close() // waits for the cleanup, which runs in the background
	if n, _ := rdb.Exists(ctx, k.lock).Result(); n != 0 {
		t.Fatal("a failed acquire left its lock behind")
	}
}

// A lease acquired WithAutoRenew(false) and not extended ends: the holder
// sees the loss on its own, and the name is free again.
func TestUnrenewedLeaseEnds(t *testing.T) {
	rdb := newClient(t)
	f := NewFactory(rdb, WithKeyPrefix(testPrefix), WithTTL(time.Second), WithLogger(nil))
	defer f.Close()
	ctx := ctxT(t)
	name := uniq(t, "x")
	h, err := f.Acquire(ctx, name, WithAutoRenew(false))
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-h.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("Done not closed after the lease ran out")
	}
	if !errors.Is(h.Err(), ErrLockLost) {
		t.Fatalf("Err = %v", h.Err())
	}
	testenv.Eventually(t, 5*time.Second, "key of the ended lease removed", func() bool {
		n, _ := rdb.Exists(ctx, h.k.lock).Result()
		return n == 0
	})
	// Extend in time keeps it.
	h, err = f.Acquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 6; i++ {
		time.Sleep(250 * time.Millisecond)
		if err := h.Extend(ctx); err != nil {
			t.Fatalf("Extend %d: %v", i, err)
		}
	}
	if h.Err() != nil {
		t.Fatalf("an extended lease was lost: %v", h.Err())
	}
	if err := h.Release(); err != nil {
		t.Fatal(err)
	}
}

func TestWithLockRenewsAndSeesLoss(t *testing.T) {
	rdb := newClient(t)
	f := NewFactory(rdb, WithKeyPrefix(testPrefix), WithTTL(500*time.Millisecond), WithLogger(nil))
	defer f.Close()
	name := uniq(t, "x")
	err := f.WithLock(ctxT(t), name, func(ctx context.Context) error {
		time.Sleep(1500 * time.Millisecond) // several TTLs
		if ctx.Err() != nil {
			t.Errorf("lost while renewing: %v", context.Cause(ctx))
		}
		// An operator removes the lock: the holder notices at its next
		// renewal and cancels ctx.
		rdb.Del(ctx, testPrefix+"{"+backend.Escape(name)+"}:lock")
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Second):
			t.Error("ctx not cancelled after the lock was removed")
			return nil
		}
	})
	if !errors.Is(err, ErrLockLost) {
		t.Fatalf("WithLock = %v; want ErrLockLost", err)
	}
}

// Close deletes its locks' keys at once (the suite's Close test only sees
// the name free within the loss bound, which a TTL running out would
// also give) and leaves no subscriber behind. The rest of Close is
// locktest's.
func TestCloseCleansUp(t *testing.T) {
	rdb := newClient(t)
	f := NewFactory(rdb, WithKeyPrefix(testPrefix), WithLogger(nil))
	ctx := ctxT(t)
	name := uniq(t, "x")
	h, err := f.Acquire(ctx, name, WithAutoRenew(true))
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		_, err := f.Acquire(ctx, name, WithWait())
		errc <- err
	}()
	testenv.Eventually(t, 10*time.Second, "waiter subscribed", func() bool { return numsub(t, rdb, f.hub.own) == 1 })
	f.Close()
	<-errc
	if n, _ := rdb.Exists(ctx, h.k.lock).Result(); n != 0 {
		t.Fatal("Close left the lock in Redis")
	}
	if n := numsub(t, rdb, f.hub.own); n != 0 {
		t.Fatalf("%d subscribers left after Close", n)
	}
}

// A permit that expires (its holder died) is found by a waiter through the
// polling fallback, without a release notification.
func TestWaitFindsExpiredPermit(t *testing.T) {
	rdb := newClient(t)
	f := testFactory(t, rdb)
	ctx := ctxT(t)
	name := uniq(t, "sem")
	h, err := f.Acquire(ctx, name, WithMaxConcurrent(2), WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer h.Release()
	dead, err := f.Acquire(ctx, name, WithMaxConcurrent(2), WithTTL(400*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	stall(dead) // as if its process died: no renewal, no release
	w, err := f.Acquire(ctx, name, WithMaxConcurrent(2), WithWait())
	if err != nil {
		t.Fatal(err)
	}
	if w.Token() <= dead.Token() {
		t.Fatalf("token %d not above the expired permit's %d", w.Token(), dead.Token())
	}
	w.Release()
}

// WithReplicaAck on a server without replicas: the acquire fails with
// ErrNotReplicated, not ErrLocked, and leaves the name free; bad n and a
// client without a single primary are refused.
func TestReplicaAckRefused(t *testing.T) {
	rdb := newClient(t)
	ctx := ctxT(t)
	f := NewFactory(rdb, WithKeyPrefix(testPrefix), WithLogger(nil), WithReplicaAck(1))
	defer f.Close()
	name := uniq(t, "x")
	if _, err := f.Acquire(ctx, name); !errors.Is(err, ErrNotReplicated) || errors.Is(err, lock.ErrLocked) {
		t.Fatalf("Acquire without replicas = %v; want ErrNotReplicated", err)
	}
	g := NewFactory(rdb, WithKeyPrefix(testPrefix), WithLogger(nil))
	defer g.Close()
	h, err := g.Acquire(ctx, name)
	if err != nil {
		t.Fatalf("after the refused acquire: %v; want the name free", err)
	}
	h.Release()
	if err := NewFactory(rdb, WithReplicaAck(0)).Err(); !errors.Is(err, lock.ErrInvalidOption) {
		t.Errorf("WithReplicaAck(0): Err() = %v", err)
	}
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": testenv.RedisAddr()}})
	defer ring.Close()
	if err := NewFactory(ring, WithReplicaAck(1)).Err(); !errors.Is(err, lock.ErrInvalidOption) {
		t.Errorf("WithReplicaAck on a Ring: Err() = %v", err)
	}
}
