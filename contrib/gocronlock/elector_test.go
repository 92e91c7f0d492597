package gocronlock_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/contrib/gocronlock"
	"github.com/ubgo/lock/memlock"
)

// The Elector's scheduler scenarios (three replicas handing leadership
// over, on memlock and on Redis) are in the tests module,
// tests/gocronlock/elector_test.go, so that this module needs no Redis
// client.

const handoverBound = 10 * time.Second // generous: the test measures, it does not race

func TestElectorStates(t *testing.T) {
	f := memlock.NewFactory()
	defer f.Close()
	ctx := context.Background()
	other, err := f.Acquire(ctx, "gocron:leader")
	if err != nil {
		t.Fatal(err)
	}
	e := gocronlock.NewElector(f.AsLocker(), "leader",
		gocronlock.WithRetryInterval(10*time.Millisecond), gocronlock.WithTakeoverDelay(0))
	// Another owner holds it: contention, not a failure.
	waitFor(handoverBound, func() bool { return errors.Is(e.IsLeader(ctx), lock.ErrLocked) })
	if err := e.IsLeader(ctx); !errors.Is(err, gocronlock.ErrNotLeader) || !errors.Is(err, lock.ErrLocked) {
		t.Fatalf("IsLeader while another holds the lock = %v", err)
	}
	if e.Holder() != nil {
		t.Fatal("Holder while not leader")
	}
	lctx, cancel := e.LeaderContext(ctx)
	if !errors.Is(context.Cause(lctx), gocronlock.ErrNotLeader) {
		t.Fatalf("LeaderContext of a follower: cause %v", context.Cause(lctx))
	}
	cancel()
	other.Release()
	if !waitFor(handoverBound, func() bool { return e.IsLeader(ctx) == nil }) {
		t.Fatalf("did not become leader: %v", e.IsLeader(ctx))
	}
	h := e.Holder()
	if h == nil || h.Token() != 2 {
		t.Fatalf("Holder = %v", h)
	}
	lctx, cancel = e.LeaderContext(ctx)
	defer cancel()
	f.ForceLoss("gocron:leader")
	<-lctx.Done()
	if err := context.Cause(lctx); !errors.Is(err, gocronlock.ErrNotLeader) || !errors.Is(err, lock.ErrLockLost) {
		t.Fatalf("LeaderContext cause after loss = %v", err)
	}
	if err := e.IsLeader(ctx); err == nil {
		t.Fatal("still leader after the loss")
	}
	// It campaigns again and wins the free lock.
	if !waitFor(handoverBound, func() bool { return e.IsLeader(ctx) == nil }) {
		t.Fatalf("did not win again: %v", e.IsLeader(ctx))
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if info, _ := f.Inspect(ctx, "gocron:leader"); len(info.Holders) != 0 {
		t.Fatal("Close did not release the leader lock")
	}
	if err := e.IsLeader(ctx); !errors.Is(err, lock.ErrClosed) {
		t.Fatalf("IsLeader after Close = %v", err)
	}
	if err := e.Close(); err != nil {
		t.Fatalf("second Close = %v", err)
	}
}

// A backend failure is not contention.
func TestElectorBackendDown(t *testing.T) {
	f := memlock.NewFactory()
	f.Close()
	e := gocronlock.NewElector(f.AsLocker(), "leader", gocronlock.WithRetryInterval(10*time.Millisecond), gocronlock.WithLogger(nil))
	defer e.Close()
	var err error
	waitFor(handoverBound, func() bool { err = e.IsLeader(context.Background()); return errors.Is(err, lock.ErrClosed) })
	if !errors.Is(err, gocronlock.ErrNotLeader) || errors.Is(err, lock.ErrLocked) || !errors.Is(err, lock.ErrClosed) {
		t.Fatalf("IsLeader with the backend down = %v", err)
	}
}

// The campaign of a waiting Locker blocks in Acquire; Close must still end
// it at once.
func TestElectorCloseWhileWaiting(t *testing.T) {
	f := memlock.NewFactory()
	defer f.Close()
	other, _ := f.Acquire(context.Background(), "gocron:leader")
	defer other.Release()
	e := gocronlock.NewElector(f.AsLocker(lock.WithWait()), "leader")
	waitFor(handoverBound, func() bool { return f.Waiting("gocron:leader") == 1 })
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); e.Close() }()
	wg.Wait()
	if f.Waiting("gocron:leader") != 0 {
		t.Fatal("waiter left behind")
	}
}
