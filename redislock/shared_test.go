package redislock

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/internal/testenv"
)

// waitJoined returns once a mutex waiter of f joined the queue of name
// (or, for readers, waits on its channel).
func waitJoined(t *testing.T, f *Factory, name string, n int) {
	t.Helper()
	testenv.Eventually(t, 30*time.Second, fmt.Sprintf("%d waiters on %q", n, name), func() bool {
		return f.hub.waiting(keysFor(testPrefix, name).channel) >= n
	})
}

// Inspect and List of a name held shared show its readers as holders (in
// token order, limit 1) and a writer queued behind them as waiting; the
// name is listed once.
func TestInspectShared(t *testing.T) {
	rdb := newClient(t)
	f := testFactory(t, rdb, WithTTL(time.Minute))
	ctx := ctxT(t)
	name := uniq(t, "x")
	r1, err := f.Acquire(ctx, name, WithShared(), WithOwner("r1"))
	if err != nil {
		t.Fatal(err)
	}
	r2, err := testFactory(t, rdb).Acquire(ctx, name, WithShared(), WithOwner("r2"))
	if err != nil {
		t.Fatal(err)
	}
	if r1.Key() != r2.Key() || r1.Key() != keysFor(testPrefix, name).lock {
		t.Errorf("readers' keys %q, %q; want the lock key", r1.Key(), r2.Key())
	}
	wf := testFactory(t, rdb)
	got := make(chan error, 1)
	go func() {
		w, err := wf.Acquire(ctx, name, WithWait())
		if err == nil {
			err = w.Release()
		}
		got <- err
	}()
	waitJoined(t, wf, name, 1)
	info, err := f.Inspect(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if info.Limit != 1 || info.Waiting != 1 || len(info.Holders) != 2 || info.Holders[0].Owner != "r1" || info.Holders[1].Owner != "r2" {
		t.Fatalf("Inspect with two readers and a waiting writer = %+v", info)
	}
	n := 0
	for li, err := range f.List(ctx, name) {
		if err != nil {
			t.Fatal(err)
		}
		if li.Name == name {
			n++
			if len(li.Holders) != 2 || li.Waiting != 1 {
				t.Errorf("List: %+v", li)
			}
		}
	}
	if n != 1 {
		t.Errorf("List reported %q %d times; want once", name, n)
	}
	r1.Release()
	r2.Release()
	if err := <-got; err != nil {
		t.Fatalf("writer: %v", err)
	}
}

// A writer that gives up waiting for readers leaves the queue: new
// readers get in at once, not when the queue expires.
func TestSharedWriterGivesUp(t *testing.T) {
	rdb := newClient(t)
	f := testFactory(t, rdb, WithTTL(time.Minute))
	ctx := ctxT(t)
	name := uniq(t, "x")
	r, err := f.Acquire(ctx, name, WithShared())
	if err != nil {
		t.Fatal(err)
	}
	defer r.Release()
	wf := testFactory(t, rdb, WithTTL(time.Minute))
	wctx, cancel := context.WithCancel(ctx)
	got := make(chan error, 1)
	go func() {
		_, err := wf.Acquire(wctx, name, WithWait())
		got <- err
	}()
	waitJoined(t, wf, name, 1)
	if _, err := f.Acquire(ctx, name, WithShared()); !errors.Is(err, ErrLocked) {
		t.Fatalf("a reader while the writer waits: %v; want ErrLocked", err)
	}
	cancel()
	if err := <-got; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled writer: %v", err)
	}
	if n, _ := rdb.Exists(ctx, keysFor(testPrefix, name).queue).Result(); n != 0 {
		t.Fatal("the queue outlived the writer that gave up")
	}
	r2, err := f.Acquire(ctx, name, WithShared())
	if err != nil {
		t.Fatalf("a reader after the writer gave up: %v", err)
	}
	r2.Release()
}

// A name is shared or a semaphore: a reader on a semaphore's name, and a
// semaphore on a name held shared, are ErrLimitMismatch.
func TestSharedModeMismatch(t *testing.T) {
	f := testFactory(t, newClient(t))
	ctx := ctxT(t)
	name := uniq(t, "x")
	s, err := f.Acquire(ctx, name, WithMaxConcurrent(2))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Acquire(ctx, name, WithShared()); !errors.Is(err, lock.ErrLimitMismatch) {
		t.Fatalf("a reader on a held semaphore: %v; want ErrLimitMismatch", err)
	}
	s.Release()
	r, err := f.Acquire(ctx, name, WithShared())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Acquire(ctx, name, WithMaxConcurrent(2)); !errors.Is(err, lock.ErrLimitMismatch) {
		t.Fatalf("a semaphore on a name held shared: %v; want ErrLimitMismatch", err)
	}
	r.Release()
}
