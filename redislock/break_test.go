package redislock

import (
	"errors"
	"testing"
	"time"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/internal/testenv"
)

// Break frees a mutex whose holder is paused: a waiter gets it with a
// larger token long before the lease (a minute) runs out, the fence under
// the name rejects the old token before anyone writes through it, and the
// old holder's Extend and Release find the lock gone without touching the
// successor's.
func TestBreakMutex(t *testing.T) {
	rdb := newClient(t)
	ctx := ctxT(t)
	name := uniq(t, "m")
	old := testFactory(t, rdb, WithTTL(time.Minute))
	h, err := old.Acquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	stall(h)
	fence := NewFence(rdb, WithKeyPrefix(testPrefix))
	if err := fence.RejectIfStale(ctx, name, h.Token()); err != nil {
		t.Fatalf("fence before the break: %v", err)
	}

	// Two waiters, queued in turn.
	waiter := testFactory(t, rdb)
	got := make(chan *Holder, 2)
	errc := make(chan error, 2)
	for i := range 2 {
		go func() {
			w, err := testFactory(t, rdb).Acquire(ctx, name, WithWait())
			if err != nil {
				errc <- err
				return
			}
			got <- w
		}()
		testenv.Eventually(t, 10*time.Second, "the waiter queued", func() bool {
			return rdb.LLen(ctx, keysFor(testPrefix, name).queue).Val() == int64(i+1)
		})
	}

	if err := testFactory(t, rdb).Break(ctx, name); err != nil {
		t.Fatalf("Break: %v", err)
	}
	if err := fence.RejectIfStale(ctx, name, h.Token()); !errors.Is(err, lock.ErrStaleToken) {
		t.Errorf("fence after the break, old token: %v, want ErrStaleToken", err)
	}
	var w *Holder
	select {
	case w = <-got:
	case err := <-errc:
		t.Fatalf("waiter: %v", err)
	case <-time.After(30 * time.Second): // half the lease: the break freed it, not expiry
		t.Fatal("waiter did not get the lock after the break")
	}
	if w.Token() <= h.Token() {
		t.Errorf("successor's token %d, not above the broken holder's %d", w.Token(), h.Token())
	}
	if err := fence.RejectIfStale(ctx, name, w.Token()); err != nil {
		t.Errorf("fence, successor's token: %v", err)
	}
	defer func() {
		// The second waiter kept its place: it gets the lock next.
		w.Release()
		select {
		case w2 := <-got:
			if w2.Token() <= w.Token() {
				t.Errorf("second waiter's token %d, not above the first's %d", w2.Token(), w.Token())
			}
			w2.Release()
		case err := <-errc:
			t.Errorf("second waiter: %v", err)
		case <-time.After(30 * time.Second):
			t.Error("second waiter did not get the lock after the first released it")
		}
	}()
	if err := h.Extend(ctx); !errors.Is(err, ErrLockLost) {
		t.Errorf("broken holder's Extend: %v, want ErrLockLost", err)
	}
	if !isClosed(h.Done()) || !errors.Is(h.Err(), lock.ErrLockLost) {
		t.Errorf("broken holder: Done closed %v, Err %v", isClosed(h.Done()), h.Err())
	}
	if err := h.Release(); !errors.Is(err, ErrLockLost) {
		t.Errorf("broken holder's Release: %v, want ErrLockLost", err)
	}
	info, err := waiter.Inspect(ctx, name)
	if err != nil || len(info.Holders) != 1 || info.Holders[0].Token != w.Token() {
		t.Errorf("after the old holder's Release: %+v, %v; want the successor holding it", info, err)
	}
}

// An auto-renewed holder that is alive learns of the break at its next
// renewal: Done closes with ErrLockLost.
func TestBreakRenewedHolderLearns(t *testing.T) {
	rdb := newClient(t)
	ctx := ctxT(t)
	name := uniq(t, "r")
	h, err := testFactory(t, rdb, WithTTL(3*time.Second)).Acquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if err := testFactory(t, rdb).Break(ctx, name); err != nil {
		t.Fatalf("Break: %v", err)
	}
	select {
	case <-h.Done():
	case <-time.After(time.Minute):
		t.Fatal("Done not closed after the break")
	}
	if !errors.Is(h.Err(), ErrLockLost) {
		t.Errorf("Err %v, want ErrLockLost", h.Err())
	}
}

// Break frees every permit of a semaphore; the token counter stays, so the
// next permit's token is above them all, and the fence rejects the highest.
func TestBreakSemaphore(t *testing.T) {
	rdb := newClient(t)
	ctx := ctxT(t)
	name := uniq(t, "s")
	f := testFactory(t, rdb, WithTTL(time.Minute), WithMaxConcurrent(3))
	var hs []*Holder
	for range 3 {
		h, err := f.Acquire(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		stall(h)
		hs = append(hs, h)
	}
	if _, err := f.Acquire(ctx, name); !errors.Is(err, ErrLocked) {
		t.Fatalf("fourth permit: %v, want ErrLocked", err)
	}
	if err := testFactory(t, rdb).Break(ctx, name); err != nil {
		t.Fatalf("Break: %v", err)
	}
	if info, err := f.Inspect(ctx, name); err != nil || len(info.Holders) != 0 {
		t.Errorf("after the break: %+v, %v; want no holder", info, err)
	}
	fence := NewFence(rdb, WithKeyPrefix(testPrefix))
	if err := fence.RejectIfStale(ctx, name, hs[2].Token()); !errors.Is(err, lock.ErrStaleToken) {
		t.Errorf("fence, highest broken token: %v, want ErrStaleToken", err)
	}
	n, err := f.Acquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Release()
	for i, h := range hs {
		if n.Token() <= h.Token() {
			t.Errorf("new permit's token %d, not above broken permit %d's %d", n.Token(), i, h.Token())
		}
		if err := h.Extend(ctx); !errors.Is(err, ErrLockLost) {
			t.Errorf("broken permit %d: Extend %v, want ErrLockLost", i, err)
		}
	}
}

// Break of a free name says so and writes nothing; a bad name is
// ErrInvalidName; a fence record above the broken tokens is left alone.
func TestBreakFreeAndFence(t *testing.T) {
	rdb := newClient(t)
	ctx := ctxT(t)
	f := testFactory(t, rdb)
	name := uniq(t, "free")
	if err := f.Break(ctx, name); !errors.Is(err, lock.ErrNotHeld) {
		t.Errorf("Break of a free name: %v, want ErrNotHeld", err)
	}
	fence := NewFence(rdb, WithKeyPrefix(testPrefix))
	if n, _ := rdb.Exists(ctx, fence.Key(name)).Result(); n != 0 {
		t.Errorf("Break of a free name wrote the fence record")
	}
	if err := f.Break(ctx, ""); !errors.Is(err, lock.ErrInvalidName) {
		t.Errorf("Break(\"\"): %v, want ErrInvalidName", err)
	}

	h, err := f.Acquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	const high = "99999999999999999999" // above every token
	if err := rdb.Set(ctx, fence.Key(name), high, 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := f.Break(ctx, name); err != nil {
		t.Fatal(err)
	}
	if v, _ := rdb.Get(ctx, fence.Key(name)).Result(); v != high {
		t.Errorf("fence record %q after the break, want it kept at %s", v, high)
	}
	if err := h.Extend(ctx); !errors.Is(err, ErrLockLost) {
		t.Errorf("Extend after the break: %v", err)
	}
}

// On Redis Cluster the script's keys (the fence record's too) share the
// name's slot: Break of a mutex and of a semaphore works, and the fence
// rejects the freed token.
func TestBreakOnCluster(t *testing.T) {
	cc, _ := startCluster(t)
	ctx := ctxT(t)
	f := NewFactory(cc, WithKeyPrefix(testPrefix), WithLogger(nil))
	t.Cleanup(func() { f.Close() })
	fence := NewFence(cc, WithKeyPrefix(testPrefix))
	for _, limit := range []int{1, 2} {
		name := uniq(t, "c")
		h, err := f.Acquire(ctx, name, WithMaxConcurrent(limit))
		if err != nil {
			t.Fatal(err)
		}
		if err := f.Break(ctx, name); err != nil {
			t.Fatalf("limit %d: Break: %v", limit, err)
		}
		if err := fence.RejectIfStale(ctx, name, h.Token()); !errors.Is(err, lock.ErrStaleToken) {
			t.Errorf("limit %d: fence after the break: %v, want ErrStaleToken", limit, err)
		}
		if err := h.Extend(ctx); !errors.Is(err, ErrLockLost) {
			t.Errorf("limit %d: Extend after the break: %v, want ErrLockLost", limit, err)
		}
	}
}
