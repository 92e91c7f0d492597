package redislock

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ubgo/lock/internal/testenv"
)

// The waiters queue in a list of the name's own, which expires (two of the
// waiters' TTLs at most), and the lock's value only carries a flag: a
// waiter that gives up leaves the list, and the release after it frees the
// name and drops the flag with the value.
func TestQueueKeyLeavesNothing(t *testing.T) {
	rdb := newClient(t)
	f := testFactory(t, rdb)
	ctx := ctxT(t)
	name := uniq(t, "x")
	k := keysFor(testPrefix, name)
	h, err := f.Acquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	got := make(chan error, 1)
	go func() {
		w, err := testFactory(t, newClient(t)).Acquire(wctx, name, WithWait())
		if err == nil {
			w.Release()
		}
		got <- err
	}()
	testenv.Eventually(t, 10*time.Second, "the waiter queued", func() bool { return rdb.LLen(ctx, k.queue).Val() == 1 })
	v := rdb.Get(ctx, k.lock).Val()
	if _, flags, _ := strings.Cut(v, "\n"); flags != "q" {
		t.Errorf("lock value %q: want the holder's line and the flag q", v)
	}
	if ttl := rdb.PTTL(ctx, k.queue).Val(); ttl <= 0 || ttl > 2*DefaultTTL {
		t.Errorf("queue PTTL %v; want at most two TTLs", ttl)
	}
	cancel()
	if err := <-got; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled waiter: %v", err)
	}
	if n := rdb.Exists(ctx, k.queue).Val(); n != 0 {
		t.Fatal("the queue outlived the waiter that gave up")
	}
	if err := h.Release(); err != nil {
		t.Fatal(err)
	}
	if n := rdb.Exists(ctx, k.lock).Val(); n != 0 {
		t.Fatal("the release of a flagged value with nobody queued left the lock")
	}
}
