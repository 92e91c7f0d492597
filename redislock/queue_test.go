package redislock

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/ubgo/lock/internal/testenv"
)

// The waiter queue (lua/mutex_acquire.lua, mutex_release.lua, wait.go).

// followBound is how long after a lease of queueTTL ends a waiter must have
// the name: generous for a loaded machine, and below maxPoll, which is what
// a waiter that was not told about the lease would wait for.
const (
	queueTTL    = 500 * time.Millisecond
	followBound = 4 * time.Second
)

// waitQueued waits until Inspect counts n waiters queued for name.
func waitQueued(t *testing.T, f *Factory, name string, n int) {
	t.Helper()
	testenv.Eventually(t, 10*time.Second, fmt.Sprintf("%d waiters queued", n), func() bool {
		info, err := f.Inspect(ctx0(), name)
		return err == nil && info.Waiting == n
	})
}

// acquireAsync starts a waiting Acquire on its own factory and client, as
// another process would wait.
func acquireAsync(t *testing.T, ctx context.Context, addr, name string, ttl time.Duration) (*Factory, <-chan result2) {
	f := NewFactory(dial(t, addr), WithKeyPrefix(testPrefix), WithLogger(nil), WithTTL(ttl))
	t.Cleanup(func() { f.Close() })
	got := make(chan result2, 1)
	go func() {
		h, err := f.Acquire(ctx, name, WithWait())
		got <- result2{h, err, time.Now()}
	}()
	return f, got
}

type result2 struct {
	h   *Holder
	err error
	at  time.Time
}

// childWaiter runs in a child process: it waits for the name, reporting
// its factory's channel first.
func childWaiter(addr, name string, ttl time.Duration) {
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	f := NewFactory(rdb, WithKeyPrefix(testPrefix), WithTTL(ttl), WithLogger(nil))
	fmt.Printf("child: channel %s\n", f.hub.own)
	h, err := f.Acquire(context.Background(), name, WithWait())
	if err != nil {
		fmt.Printf("child: error %v\n", err)
		os.Exit(1)
	}
	fmt.Printf("child: token %d\n", h.Token())
	time.Sleep(time.Minute)
}

// A holder process killed with SIGKILL while waiters of other factories
// queue behind it: the first of them has the name within a bound below
// the poll interval after the lease ends, and the others follow in turn.
func TestSIGKILLHolderWithQueue(t *testing.T) {
	if testenv.Child() == "kill-queued-holder" {
		childHolder(testenv.RedisAddr(), os.Getenv(childName), queueTTL)
		return
	}
	rdb := newClient(t)
	f := testFactory(t, rdb)
	ctx := ctxT(t)
	name := uniq(t, "x")
	c := startChild(t, "kill-queued-holder", "TestSIGKILLHolderWithQueue", name)
	tok := c.token()
	var gots []<-chan result2
	for i := range 3 {
		_, got := acquireAsync(t, ctx, testenv.RedisAddr(), name, queueTTL)
		gots = append(gots, got)
		waitQueued(t, f, name, i+1)
	}
	c.p.Kill()
	killed := time.Now()
	// The queue ended with the lease: the first waiter to look takes the
	// name, and the others follow in turn.
	type indexed struct {
		i int
		result2
	}
	all := make(chan indexed, len(gots))
	for i, got := range gots {
		go func() { all <- indexed{i, <-got} }()
	}
	for range gots {
		var x indexed
		select {
		case x = <-all:
		case <-time.After(queueTTL + followBound):
			t.Fatalf("no lock within %v of the kill or the last release (lease %v)", queueTTL+followBound, queueTTL)
		}
		i, r := x.i, x.result2
		if r.err != nil {
			t.Fatalf("waiter %d: %v", i, r.err)
		}
		if r.h.Token() <= tok {
			t.Fatalf("waiter %d: token %d not above %d", i, r.h.Token(), tok)
		}
		tok = r.h.Token()
		t.Logf("waiter %d: lock %v after the kill", i, r.at.Sub(killed).Round(time.Millisecond))
		r.h.Release()
	}
}

// A waiter process killed while it is first in the queue: the name goes
// to the next waiter when the holder releases. On one server the release
// sees nobody listens on the dead factory's channel and skips it; where it
// cannot tell (a cluster) the dead waiter is granted the name, and the
// next one takes it when that lease ends.
func TestSIGKILLWaiterAtHead(t *testing.T) {
	if testenv.Child() == "kill-head-waiter" {
		childWaiter(testenv.RedisAddr(), os.Getenv(childName), queueTTL)
		return
	}
	for _, mode := range []string{"skipped", "granted"} {
		t.Run(mode, func(t *testing.T) {
			rdb := newClient(t)
			f := testFactory(t, rdb, WithTTL(time.Minute))
			if mode == "granted" {
				f.together.Store(false) // as on a cluster: a PUBLISH count says nothing
			}
			ctx := ctxT(t)
			name := uniq(t, "x")
			h, err := f.Acquire(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			c := startChild(t, "kill-head-waiter", "TestSIGKILLWaiterAtHead", name)
			ch, ok := strings.CutPrefix(c.line(), "channel ")
			if !ok {
				t.Fatal("child did not report its channel")
			}
			waitQueued(t, f, name, 1)
			_, got := acquireAsync(t, ctx, testenv.RedisAddr(), name, queueTTL)
			waitQueued(t, f, name, 2)
			c.p.Kill()
			testenv.Eventually(t, 10*time.Second, "dead child unsubscribed", func() bool { return numsub(t, rdb, ch) == 0 })
			h.Release()
			released := time.Now()
			select {
			case r := <-got:
				if r.err != nil {
					t.Fatal(r.err)
				}
				if r.h.Token() <= h.Token() {
					t.Fatalf("token %d not above %d", r.h.Token(), h.Token())
				}
				t.Logf("next waiter: lock %v after the release", r.at.Sub(released).Round(time.Millisecond))
				r.h.Release()
			case <-time.After(queueTTL + followBound):
				t.Fatalf("next waiter: no lock within %v of the release", queueTTL+followBound)
			}
		})
	}
}

// A waiter whose ctx ends after a release granted it the name, before it
// learnt of it, hands the name on to the next waiter before its Acquire
// returns.
func TestGrantedWaiterGivesUp(t *testing.T) {
	rdb := newClient(t)
	f := testFactory(t, rdb)
	ctx := ctxT(t)
	name := uniq(t, "x")
	h, err := f.Acquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	actx, cancel := context.WithCancel(ctx)
	fa, gotA := acquireAsync(t, actx, testenv.RedisAddr(), name, DefaultTTL)
	waitQueued(t, f, name, 1)
	_, gotB := acquireAsync(t, ctx, testenv.RedisAddr(), name, DefaultTTL)
	waitQueued(t, f, name, 2)
	// A's factory does not see the grant until A gave up.
	fa.hub.mu.Lock()
	if err := h.Release(); err != nil {
		fa.hub.mu.Unlock()
		t.Fatal(err)
	}
	info, err := f.Inspect(ctx, name)
	if err != nil || len(info.Holders) != 1 || info.Holders[0].Token != h.Token()+1 || info.Waiting != 1 {
		fa.hub.mu.Unlock()
		t.Fatalf("after the release: %+v, %v; want A granted token %d, B queued", info, err, h.Token()+1)
	}
	cancel()
	fa.hub.mu.Unlock()
	ra := <-gotA
	if !errors.Is(ra.err, ErrLocked) || !errors.Is(ra.err, context.Canceled) {
		if ra.err == nil {
			ra.h.Release()
		}
		t.Fatalf("A = %v; want ErrLocked and context.Canceled", ra.err)
	}
	var rb result2
	select {
	case rb = <-gotB:
	case <-time.After(followBound):
		t.Fatal("B did not get the name A gave up")
	}
	if rb.err != nil {
		t.Fatal(rb.err)
	}
	defer rb.h.Release()
	if rb.h.Token() != h.Token()+2 {
		t.Fatalf("B's token %d, want %d", rb.h.Token(), h.Token()+2)
	}
}

// A release that grants the name to an id its factory does not wait for
// (a copy of an attempt that queued after its caller gave up) is given on
// to the next waiter by that factory.
func TestGrantToGoneWaiter(t *testing.T) {
	rdb := newClient(t)
	f := testFactory(t, rdb)
	ctx := ctxT(t)
	name := uniq(t, "x")
	h, err := f.Acquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	// A waiter of fa's that is in the queue but not in fa's hub.
	fa := testFactory(t, newClient(t))
	_, gotB := acquireAsync(t, ctx, testenv.RedisAddr(), name, DefaultTTL)
	waitQueued(t, f, name, 1)
	k := keysFor(testPrefix, name)
	keep, _ := fa.hub.join(fa.hub.own, k.channel, newID()) // keeps fa subscribed
	defer keep.Close()
	testenv.Eventually(t, 10*time.Second, "fa subscribed", fa.hub.isReady)
	// Put the gone id first in the queue.
	gone := newID()
	ls := fa.leaseOf(&fa.cfg.Options)
	entry := gone + strconv.FormatInt(ls.ttl.Milliseconds(), 10) + ":" + strconv.Itoa(len(fa.hub.own)) + ":" + fa.hub.own + ls.meta
	if err := rdb.LPush(ctx, k.queue, entry).Err(); err != nil {
		t.Fatal(err)
	}
	waitQueued(t, f, name, 2)
	h.Release()
	select {
	case rb := <-gotB:
		if rb.err != nil {
			t.Fatal(rb.err)
		}
		if rb.h.Token() != h.Token()+2 {
			t.Fatalf("B's token %d, want %d (after the gone waiter's)", rb.h.Token(), h.Token()+2)
		}
		rb.h.Release()
	case <-time.After(followBound):
		t.Fatal("the grant to a gone waiter was not given on")
	}
}

// The calls Redis makes per acquisition while 8 factories contend for one
// name do not grow with the waiters: one acquire script that queues, one
// release script that hands over, one acquire script by which the granted
// waiter takes the name, and no retries.
func TestContendedCalls(t *testing.T) {
	srv := startServer(t)
	admin := dial(t, srv.addr())
	ctx := ctxT(t)
	name := uniq(t, "x")
	const workers, rounds = 8, 50
	fs := make([]*Factory, workers)
	for i := range fs {
		fs[i] = NewFactory(dial(t, srv.addr()), WithKeyPrefix(testPrefix), WithLogger(nil))
		defer fs[i].Close()
	}
	// Warm up: scripts loaded, every factory subscribed.
	for _, f := range fs {
		h, err := f.Acquire(ctx, name, WithWait())
		if err != nil {
			t.Fatal(err)
		}
		h.Release()
	}
	stats := func() (calls, scripts float64) {
		info, err := admin.Info(ctx, "commandstats").Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(info, "\n") {
			stat, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_")
			cmd, rest, ok2 := strings.Cut(stat, ":calls=")
			if !ok || !ok2 || cmd == "info" {
				continue
			}
			num, _, _ := strings.Cut(rest, ",")
			n, _ := strconv.ParseFloat(num, 64)
			calls += n
			if cmd == "evalsha" || cmd == "eval" {
				scripts += n
			}
		}
		return calls, scripts
	}
	c0, s0 := stats()
	var wg sync.WaitGroup
	per := make([]int, workers)
	for i, f := range fs {
		wg.Go(func() {
			for range rounds {
				h, err := f.Acquire(ctx, name, WithWait())
				if err != nil {
					t.Error(err)
					return
				}
				per[i]++
				h.Release()
			}
		})
	}
	wg.Wait()
	c1, s1 := stats()
	n := float64(workers * rounds)
	calls, scripts := (c1-c0)/n, (s1-s0)/n
	t.Logf("%.1f calls, %.2f scripts per acquisition", calls, scripts)
	// The steady state is 15 calls and 3 scripts: the release hands over
	// (GET, LPOP, INCR, PUBLISH, SET), the granted waiter takes the name
	// (GET, PEXPIRE, SET of its took marker), the releaser queues again
	// (GET, RPUSH, PTTL, PTTL); the first and last acquisitions of a run
	// find the name free, the queue's expiry is raised once in a while,
	// and a waiter whose look raced a release looks once more.
	if calls > 17 || scripts > 3.5 {
		t.Fatalf("%.1f calls, %.2f scripts per acquisition; want about 15 and 3", calls, scripts)
	}
}
