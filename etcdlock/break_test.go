package etcdlock_test

import (
	"errors"
	"testing"
	"time"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/etcdlock"
)

// Break frees a mutex: the holder's watch sees it at once (Done closes
// with ErrLockLost), the waiter gets it with a larger token, and the fence
// under the name rejects the old token before anyone writes through it.
func TestBreakMutex(t *testing.T) {
	cli := client(t)
	ctx := ctxT(t, time.Minute)
	prefix := testPrefix(t)
	opts := []etcdlock.Option{etcdlock.WithKeyPrefix(prefix), etcdlock.WithLogger(nil)}
	name := "jobs/nightly"
	h, err := factory(t, cli, opts...).Acquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	fence := etcdlock.NewFence(cli, opts...)
	if err := fence.RejectIfStale(ctx, name, h.Token()); err != nil {
		t.Fatalf("fence before the break: %v", err)
	}
	op := factory(t, cli, opts...)
	waiter := factory(t, cli, opts...)
	got := make(chan *etcdlock.Holder, 1)
	errc := make(chan error, 1)
	go func() {
		w, err := waiter.Acquire(ctx, name, etcdlock.WithWait())
		if err != nil {
			errc <- err
			return
		}
		got <- w
	}()
	waitWaiting(t, op, name, 1)

	if err := op.Break(ctx, name); err != nil {
		t.Fatalf("Break: %v", err)
	}
	if err := fence.RejectIfStale(ctx, name, h.Token()); !errors.Is(err, lock.ErrStaleToken) {
		t.Errorf("fence after the break, old token: %v, want ErrStaleToken", err)
	}
	waitClosed(t, h.Done(), 30*time.Second, "the broken holder's Done")
	if !errors.Is(h.Err(), etcdlock.ErrLockLost) {
		t.Errorf("broken holder's Err: %v, want ErrLockLost", h.Err())
	}
	var w *etcdlock.Holder
	select {
	case w = <-got:
	case err := <-errc:
		t.Fatalf("waiter: %v", err)
	case <-time.After(30 * time.Second): // the lease is a minute: the break freed it
		t.Fatal("waiter did not get the lock after the break")
	}
	defer w.Release()
	if w.Token() <= h.Token() {
		t.Errorf("successor's token %d, not above the broken holder's %d", w.Token(), h.Token())
	}
	if err := fence.RejectIfStale(ctx, name, w.Token()); err != nil {
		t.Errorf("fence, successor's token: %v", err)
	}
	if err := h.Release(); !errors.Is(err, etcdlock.ErrLockLost) {
		t.Errorf("broken holder's Release: %v, want ErrLockLost", err)
	}
	if info, err := op.Inspect(ctx, name); err != nil || len(info.Holders) != 1 || info.Holders[0].Token != w.Token() {
		t.Errorf("after the old holder's Release: %+v, %v; want the successor holding it", info, err)
	}
}

// Break frees every permit of a semaphore and no waiter; the waiters then
// take the permits.
func TestBreakSemaphore(t *testing.T) {
	cli := client(t)
	ctx := ctxT(t, time.Minute)
	opts := []etcdlock.Option{etcdlock.WithKeyPrefix(testPrefix(t)), etcdlock.WithLogger(nil), etcdlock.WithMaxConcurrent(2)}
	name := "pool"
	f := factory(t, cli, opts...)
	var hs []*etcdlock.Holder
	for range 2 {
		h, err := f.Acquire(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		hs = append(hs, h)
	}
	waiter := factory(t, cli, opts...)
	got := make(chan *etcdlock.Holder, 1)
	go func() {
		if w, err := waiter.Acquire(ctx, name, etcdlock.WithWait()); err == nil {
			got <- w
		} else {
			close(got)
		}
	}()
	waitWaiting(t, f, name, 1)
	if err := factory(t, cli, opts...).Break(ctx, name); err != nil {
		t.Fatalf("Break: %v", err)
	}
	for i, h := range hs {
		waitClosed(t, h.Done(), 30*time.Second, "a broken permit's Done")
		if !errors.Is(h.Err(), etcdlock.ErrLockLost) {
			t.Errorf("broken permit %d: Err %v", i, h.Err())
		}
	}
	w, ok := <-got
	if !ok {
		t.Fatal("waiter failed")
	}
	defer w.Release()
	if w.Token() <= hs[1].Token() {
		t.Errorf("waiter's token %d, not above the broken permits' %d", w.Token(), hs[1].Token())
	}
	info, err := f.Inspect(ctx, name)
	if err != nil || len(info.Holders) != 1 || info.Holders[0].Token != w.Token() {
		t.Errorf("after the break: %+v, %v; want only the waiter holding a permit", info, err)
	}
}

// Break of a free name says so and writes nothing; a bad name is
// ErrInvalidName.
func TestBreakFree(t *testing.T) {
	cli := client(t)
	ctx := ctxT(t, time.Minute)
	opts := []etcdlock.Option{etcdlock.WithKeyPrefix(testPrefix(t)), etcdlock.WithLogger(nil)}
	f := factory(t, cli, opts...)
	if err := f.Break(ctx, "free"); !errors.Is(err, lock.ErrNotHeld) {
		t.Errorf("Break of a free name: %v, want ErrNotHeld", err)
	}
	if resp, err := cli.Get(ctx, etcdlock.NewFence(cli, opts...).Key("free")); err != nil || len(resp.Kvs) != 0 {
		t.Errorf("Break of a free name wrote the fence record: %v %v", resp, err)
	}
	if err := f.Break(ctx, ""); !errors.Is(err, lock.ErrInvalidName) {
		t.Errorf("Break(\"\"): %v, want ErrInvalidName", err)
	}

	// A fence record above the freed token stays as it is.
	fence := etcdlock.NewFence(cli, opts...)
	h, err := f.Acquire(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	const high = 1 << 62
	if err := fence.RejectIfStale(ctx, "x", high); err != nil {
		t.Fatal(err)
	}
	if err := f.Break(ctx, "x"); err != nil {
		t.Fatalf("Break: %v", err)
	}
	if err := fence.RejectIfStale(ctx, "x", high-1); !errors.Is(err, lock.ErrStaleToken) {
		t.Errorf("fence after the break: %v; want the record kept at %d", err, uint64(high))
	}
	if err := fence.RejectIfStale(ctx, "x", high); err != nil {
		t.Errorf("fence after the break: %v; want the record kept at %d", err, uint64(high))
	}
	waitClosed(t, h.Done(), 30*time.Second, "the broken holder's Done")
}
