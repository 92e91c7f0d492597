package redislock

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/ubgo/lock"
	"github.com/ubgo/lock/backend"
	"github.com/ubgo/lock/locktest"
)

// storePrefix is a key prefix of one test, whose keys are deleted when the
// test ends: fence and ledger records never expire, and the server is
// shared.
func storePrefix(t testing.TB) string {
	t.Helper()
	prefix := fmt.Sprintf("redislock-store-test:%x:", time.Now().UnixNano())
	rdb := newClient(t)
	t.Cleanup(func() {
		ctx := context.Background()
		iter := rdb.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		for iter.Next(ctx) {
			rdb.Del(ctx, iter.Val())
		}
	})
	return prefix
}

// Each constructor call gets a client of its own, so the suites' "another
// client" really is another connection pool, as another process would be.
func TestFenceConformance(t *testing.T) {
	prefix := storePrefix(t)
	locktest.RunFence(t, func(t testing.TB) lock.Fence {
		return NewFence(newClient(t), WithKeyPrefix(prefix))
	})
}

func TestLedgerConformance(t *testing.T) {
	prefix := storePrefix(t)
	locktest.RunLedger(t, func(t testing.TB) lock.Ledger {
		return NewLedger(newClient(t), WithKeyPrefix(prefix))
	})
}

// On Redis Cluster the fence script and the ledger commands go to the slot
// of the key's hash tag, the same slot as the lock of that name.
func TestClusterFenceAndLedger(t *testing.T) {
	cc, _ := startCluster(t)
	t.Run("Fence", func(t *testing.T) {
		locktest.RunFence(t, func(t testing.TB) lock.Fence { return NewFence(cc, WithKeyPrefix(testPrefix)) })
	})
	t.Run("Ledger", func(t *testing.T) {
		locktest.RunLedger(t, func(t testing.TB) lock.Ledger { return NewLedger(cc, WithKeyPrefix(testPrefix)) })
	})
	ctx := ctxT(t)
	name := uniq(t, "a/b{c}")
	slot := func(key string) int64 {
		n, err := cc.ClusterKeySlot(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	lk := keysFor(testPrefix, name).lock
	for _, k := range []string{NewFence(cc, WithKeyPrefix(testPrefix)).Key(name), NewLedger(cc, WithKeyPrefix(testPrefix)).Key(name)} {
		if slot(k) != slot(lk) {
			t.Errorf("%s is in slot %d, the lock key %s in %d", k, slot(k), lk, slot(lk))
		}
	}
}

// The records live apart from every lock key, have no expiry (a fence that
// forgot would let a stale writer in), and hold the token in decimal.
func TestFenceAndLedgerKeys(t *testing.T) {
	prefix := storePrefix(t)
	rdb := newClient(t)
	ctx := ctxT(t)
	f, l := NewFence(rdb, WithKeyPrefix(prefix)), NewLedger(rdb, WithKeyPrefix(prefix))
	name := uniq(t, "fence")
	if got, want := f.Key(name), prefix+"fence/{"+backend.Escape(name)+"}"; got != want {
		t.Fatalf("fence key %q, want %q", got, want)
	}
	if err := f.RejectIfStale(ctx, name, 1<<63+5); err != nil {
		t.Fatal(err)
	}
	if err := l.MarkDone(ctx, name, 42); err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]string{f.Key(name): "9223372036854775813", l.Key(name): "42"} {
		v, err := rdb.Get(ctx, k).Result()
		if err != nil || v != want {
			t.Errorf("GET %s = %q, %v; want %q", k, v, err, want)
		}
		if ttl, _ := rdb.PTTL(ctx, k).Result(); ttl != -1 {
			t.Errorf("%s has TTL %v; fence and ledger records must not expire", k, ttl)
		}
	}
	// A lock of the same name is unaffected, and the default prefix applies.
	fac := NewFactory(rdb, WithKeyPrefix(prefix), WithLogger(nil))
	defer fac.Close()
	h, err := fac.Acquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	h.Release()
	if k := NewFence(rdb).Key("x"); k != DefaultKeyPrefix+"fence/{x}" {
		t.Errorf("default fence key %q", k)
	}
	// The operator's re-run: delete the record.
	rdb.Del(ctx, l.Key(name))
	if done, err := l.IsDone(ctx, name); done || err != nil {
		t.Fatalf("after DEL: done %v err %v", done, err)
	}
}

func TestFenceAndLedgerBadInput(t *testing.T) {
	ctx := context.Background()
	for what, f := range map[string]*Fence{
		"nil client":    NewFence(nil),
		"bad option":    NewFence(newClient(t), WithTTL(-1)),
		"typed nil":     NewFence((*redis.Client)(nil)),
		"valid, no key": NewFence(newClient(t)),
	} {
		err := f.RejectIfStale(ctx, "", 1)
		if what != "valid, no key" {
			err = f.RejectIfStale(ctx, "k", 1)
			if !errors.Is(err, lock.ErrInvalidOption) {
				t.Errorf("%s: %v, want ErrInvalidOption", what, err)
			}
		} else if !errors.Is(err, lock.ErrInvalidName) {
			t.Errorf("%s: %v, want ErrInvalidName", what, err)
		}
	}
	l := NewLedger(nil)
	if done, err := l.IsDone(ctx, "k"); done || !errors.Is(err, lock.ErrInvalidOption) {
		t.Errorf("nil client Done: %v %v", done, err)
	}
	if err := l.MarkDone(ctx, "k", 1); !errors.Is(err, lock.ErrInvalidOption) {
		t.Errorf("nil client MarkDone: %v", err)
	}
}

// Replicas of lock.RunOnce, each with its own client, factory and ledger.
func TestRunOnceLateReplica(t *testing.T) {
	prefix := storePrefix(t)
	locktest.RunOnceReplicas(t, func(t testing.TB, opts ...lock.Option) lock.Locker {
		f := NewFactory(newClient(t), WithKeyPrefix(prefix), WithLogger(nil))
		t.Cleanup(func() { f.Close() })
		return f.AsLocker(opts...)
	}, func(t testing.TB) lock.Ledger { return NewLedger(newClient(t), WithKeyPrefix(prefix)) })
}

// Holder A stalls past its TTL (its process paused: it neither renews nor
// notices), B takes the lock with a larger token and writes through the
// fence, and A's late write with its old token is refused.
func TestFenceStaleWriter(t *testing.T) {
	prefix := storePrefix(t)
	ctx := ctxT(t)
	name := uniq(t, "export")
	fa := NewFactory(newClient(t), WithKeyPrefix(prefix), WithLogger(nil))
	defer fa.Close()
	fb := NewFactory(newClient(t), WithKeyPrefix(prefix), WithLogger(nil))
	defer fb.Close()
	fenceA := NewFence(newClient(t), WithKeyPrefix(prefix))
	fenceB := NewFence(newClient(t), WithKeyPrefix(prefix))

	a, err := fa.Acquire(ctx, name, WithTTL(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	locktest.RunStaleWriter(t, ctx, locktest.StaleWriter{Name: name, A: a, FenceA: fenceA, FenceB: fenceB,
		TakeOver: func() (lock.Holder, error) {
			stall(a)
			b, err := fb.Acquire(ctx, name, WithWait(), WithTTL(time.Minute))
			if a.Err() != nil {
				t.Fatalf("the stalled holder should not know yet: %v", a.Err())
			}
			return b, err
		}})
}

// Fence.Apply writes its data key only with a token that is not stale, in
// the step that records the token: a stale write is refused and leaves the
// data as it was, an equal token is accepted, token 0 is never.
func TestFenceApply(t *testing.T) {
	prefix := storePrefix(t)
	rdb := newClient(t)
	ctx := ctxT(t)
	f := NewFence(rdb, WithKeyPrefix(prefix))
	name := uniq(t, "export")
	data := f.DataKey(name, ":csv")
	if want := prefix + "data/{" + backend.Escape(name) + "}:csv"; data != want {
		t.Fatalf("DataKey = %q, want %q", data, want)
	}
	get := func() string {
		t.Helper()
		v, err := rdb.Get(ctx, data).Result()
		if err != nil && err != redis.Nil {
			t.Fatal(err)
		}
		return v
	}
	if err := f.Apply(ctx, name, 0, data, "zero"); !errors.Is(err, lock.ErrStaleToken) || get() != "" {
		t.Fatalf("token 0: %v, data %q; want ErrStaleToken and nothing written", err, get())
	}
	if err := f.Apply(ctx, name, 7, data, "by 7"); err != nil || get() != "by 7" {
		t.Fatalf("token 7: %v, data %q", err, get())
	}
	if err := f.Apply(ctx, name, 6, data, "by 6"); !errors.Is(err, lock.ErrStaleToken) || get() != "by 7" {
		t.Fatalf("stale token 6: %v, data %q; want ErrStaleToken and the data of 7", err, get())
	}
	if v, _ := rdb.Get(ctx, f.Key(name)).Result(); v != "7" {
		t.Fatalf("fence record %q after the stale write, want 7", v)
	}
	if err := f.Apply(ctx, name, 7, data, "by 7 again"); err != nil || get() != "by 7 again" {
		t.Fatalf("equal token 7: %v, data %q", err, get())
	}
	// Set and RejectIfStale share the record: a RejectIfStale of 9 makes
	// 8 stale for Set.
	if err := f.RejectIfStale(ctx, name, 9); err != nil {
		t.Fatal(err)
	}
	if err := f.Apply(ctx, name, 8, data, "by 8"); !errors.Is(err, lock.ErrStaleToken) || get() != "by 7 again" {
		t.Fatalf("token 8 after 9: %v, data %q", err, get())
	}
	// A data key of another slot, or one of redislock's own keys for the
	// name, is refused before anything is sent.
	own := []string{f.Key(name), NewLedger(rdb, WithKeyPrefix(prefix)).Key(name), keysFor(prefix, name).lock, keysFor(prefix, name).token}
	for _, k := range append([]string{prefix + "data/" + name, f.DataKey("other", ""), ""}, own...) {
		if err := f.Apply(ctx, name, 10, k, "x"); !errors.Is(err, lock.ErrInvalidOption) {
			t.Errorf("data key %q: %v, want ErrInvalidOption", k, err)
		}
	}
	if v, _ := rdb.Get(ctx, f.Key(name)).Result(); v != "9" {
		t.Errorf("fence record %q after refused data keys, want 9", v)
	}
	// A key of one's own with the tag is accepted.
	mine := "objects/{" + backend.Escape(name) + "}"
	if err := f.Apply(ctx, name, 10, mine, "mine"); err != nil {
		t.Fatal(err)
	}
	rdb.Del(ctx, mine)
}
