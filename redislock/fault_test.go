package redislock

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/ubgo/lock"
	"github.com/ubgo/lock/internal/testenv"
)

// A holder that stalls past its TTL (its process paused, so neither its
// renewal nor its own deadline ran) finds, once it resumes, that Extend and
// Release report the loss, and neither touches the successor's lock.
func TestStalledHolderCannotTouchSuccessor(t *testing.T) {
	rdb := newClient(t)
	f := testFactory(t, rdb)
	ctx := ctxT(t)
	for _, limit := range []int{1, 2} {
		for _, op := range []string{"Extend", "Release"} {
			t.Run(fmt.Sprintf("limit%d/%s", limit, op), func(t *testing.T) {
				name := uniq(t, "x")
				opt := WithMaxConcurrent(limit)
				if limit > 1 {
					// Fill the other permits, so the successor has to
					// wait for the stalled holder's.
					for i := 1; i < limit; i++ {
						o, err := f.Acquire(ctx, name, opt, WithTTL(time.Minute))
						if err != nil {
							t.Fatal(err)
						}
						defer o.Release()
					}
				}
				old, err := f.Acquire(ctx, name, opt, WithTTL(300*time.Millisecond))
				if err != nil {
					t.Fatal(err)
				}
				stall(old)
				next, err := f.Acquire(ctx, name, opt, WithWait(), WithTTL(time.Minute))
				if err != nil {
					t.Fatal(err)
				}
				defer next.Release()
				if next.Token() <= old.Token() {
					t.Fatalf("successor token %d not above the stalled holder's %d", next.Token(), old.Token())
				}
				if old.Err() != nil {
					t.Fatal("the stalled holder already knows (the test did not stall it)")
				}
				switch op {
				case "Extend":
					err = old.Extend(ctx)
				case "Release":
					err = old.Release()
				}
				if !errors.Is(err, ErrLockLost) || !errors.Is(old.Err(), ErrLockLost) || !isClosed(old.Done()) {
					t.Fatalf("%s of the stalled holder = %v (Err %v); want ErrLockLost", op, err, old.Err())
				}
				info, err := f.Inspect(ctx, name)
				if err != nil {
					t.Fatal(err)
				}
				found := false
				for _, hi := range info.Holders {
					if hi.Token == next.Token() {
						found = true
						if left := time.Until(hi.Expires); left < 30*time.Second {
							t.Errorf("the successor's lease was changed: %v left of 1m", left)
						}
					}
					if hi.Token == old.Token() {
						t.Errorf("the stalled holder is still listed: %+v", info)
					}
				}
				if !found {
					t.Fatalf("the successor is gone: %+v", info)
				}
			})
		}
	}
}

const childName = "REDISLOCK_TEST_NAME"

// childHolder runs in a child process: it takes the lock with renewal
// (and opts), reports its token, and once the lock is lost reports what
// Err and Release said.
func childHolder(addr, name string, ttl time.Duration, opts ...Option) {
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	f := NewFactory(rdb, WithKeyPrefix(testPrefix), WithTTL(ttl), WithLogger(nil))
	h, err := f.Acquire(context.Background(), name, append([]Option{WithAutoRenew(true)}, opts...)...)
	if err != nil {
		fmt.Printf("child: error %v\n", err)
		os.Exit(1)
	}
	fmt.Printf("child: token %d\n", h.Token())
	select {
	case <-h.Done():
	case <-time.After(time.Minute):
		fmt.Println("child: still held")
		os.Exit(1)
	}
	rerr := h.Release()
	fmt.Printf("child: lost %v release-lost %v\n", errors.Is(h.Err(), ErrLockLost), errors.Is(rerr, lock.ErrLockLost))
	os.Exit(0)
}

type child struct {
	t     *testing.T
	p     *os.Process
	lines chan string
}

func startChild(t *testing.T, role, test, name string) *child {
	cmd := testenv.Command(t, role, test, childName+"="+name)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &child{t: t, p: cmd.Process, lines: make(chan string, 16)}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if line, ok := strings.CutPrefix(sc.Text(), "child: "); ok {
				c.lines <- line
			}
		}
		io.Copy(io.Discard, out)
		close(c.lines)
	}()
	t.Cleanup(func() {
		testenv.Resume(cmd.Process)
		cmd.Process.Kill()
		cmd.Wait()
	})
	return c
}

func (c *child) line() string {
	c.t.Helper()
	select {
	case l, ok := <-c.lines:
		if !ok {
			c.t.Fatal("child exited without reporting")
		}
		return l
	case <-time.After(30 * time.Second):
		c.t.Fatal("child did not report")
	}
	return ""
}

func (c *child) token() uint64 {
	c.t.Helper()
	l := c.line()
	tok, err := strconv.ParseUint(strings.TrimPrefix(l, "token "), 10, 64)
	if err != nil {
		c.t.Fatalf("child said %q", l)
	}
	return tok
}

// A holder process stopped (SIGSTOP) past its TTL loses the lock to a
// successor with a larger token; when it resumes it sees the loss, and its
// Release does not free the successor's lock.
func TestSIGSTOPHolder(t *testing.T) {
	if testenv.Child() == "stop-holder" {
		childHolder(testenv.RedisAddr(), os.Getenv(childName), 400*time.Millisecond)
		return
	}
	rdb := newClient(t)
	f := NewFactory(rdb, WithKeyPrefix(testPrefix), WithLogger(nil), WithTTL(time.Minute))
	defer f.Close()
	ctx := ctxT(t)
	name := uniq(t, "x")
	c := startChild(t, "stop-holder", "TestSIGSTOPHolder", name)
	tok := c.token()
	testenv.Pause(t, c.p)
	h, err := f.Acquire(ctx, name, WithWait())
	if err != nil {
		t.Fatal(err)
	}
	defer h.Release()
	if h.Token() <= tok {
		t.Fatalf("successor token %d not above the stopped holder's %d", h.Token(), tok)
	}
	if err := testenv.Resume(c.p); err != nil {
		t.Fatal(err)
	}
	if got := c.line(); got != "lost true release-lost true" {
		t.Fatalf("resumed holder: %q; want it to see the loss", got)
	}
	info, err := f.Inspect(ctx, name)
	if err != nil || len(info.Holders) != 1 || info.Holders[0].Token != h.Token() {
		t.Fatalf("after the resumed holder released: %+v, %v; want the successor still holding", info, err)
	}
}

// A waiter process stopped (SIGSTOP) across its own grant, resumed after
// the grant ran out and another client took the name, must not take the
// name on that stale grant: it asks Redis, finds the other holder and
// queues behind it, so its token comes after the other's. Each round
// gives the stale grant a chance to be taken (the grant's wake and the
// poll's both pending at the resume); a few rounds catch a waiter that
// trusts it about every other time.
func TestSIGSTOPWaiterAcrossGrant(t *testing.T) {
	const ttl = 500 * time.Millisecond
	if testenv.Child() == "stop-waiter" {
		rdb := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr()})
		f := NewFactory(rdb, WithKeyPrefix(testPrefix), WithTTL(ttl), WithLogger(nil))
		h, err := f.Acquire(context.Background(), os.Getenv(childName), WithWait())
		if err != nil {
			fmt.Printf("child: error %v\n", err)
			os.Exit(1)
		}
		fmt.Printf("child: token %d\n", h.Token())
		h.Release()
		os.Exit(0)
	}
	rdb := newClient(t)
	ctx := ctxT(t)
	for round := range 3 {
		name := uniq(t, fmt.Sprint(round))
		queue := keysFor(testPrefix, name).queue
		queued := func(n int) func() bool {
			return func() bool { return rdb.LLen(ctx, queue).Val() == int64(n) }
		}
		holder := testFactory(t, rdb, WithTTL(ttl))
		h, err := holder.Acquire(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		w := startChild(t, "stop-waiter", "TestSIGSTOPWaiterAcrossGrant", name)
		testenv.Eventually(t, 10*time.Second, "the child queued", queued(1))
		got := make(chan *Holder, 1)
		go func() {
			o, err := testFactory(t, rdb, WithTTL(ttl)).Acquire(ctx, name, WithWait())
			if err != nil {
				t.Error(err)
			}
			got <- o
		}()
		testenv.Eventually(t, 10*time.Second, "the other waiter queued behind the child", queued(2))

		testenv.Pause(t, w.p)
		h.Release() // grants the name to the stopped child
		o := <-got  // once the child's grant ran out
		if o == nil {
			t.FailNow()
		}
		if err := testenv.Resume(w.p); err != nil {
			t.Fatal(err)
		}
		// The child looks again and queues behind o, or (the bug) takes
		// its stale grant; o holds on a while either way.
		testenv.Eventually(t, 10*time.Second, "the resumed child queued behind the other holder, or took the name", func() bool {
			return len(w.lines) > 0 || queued(1)()
		})
		time.Sleep(ttl)
		select {
		case l := <-w.lines:
			t.Fatalf("round %d: the resumed child said %q while the other client held the name with token %d", round, l, o.Token())
		default:
		}
		if err := o.Release(); err != nil {
			t.Fatal(err)
		}
		if tok := w.token(); tok <= o.Token() {
			t.Fatalf("round %d: the child took the name with token %d, not above the other holder's %d: a stale grant", round, tok, o.Token())
		}
	}
}

// A holder process killed with SIGKILL frees its lock within the TTL.
func TestSIGKILLHolder(t *testing.T) {
	if testenv.Child() == "kill-holder" {
		childHolder(testenv.RedisAddr(), os.Getenv(childName), time.Second)
		return
	}
	rdb := newClient(t)
	f := testFactory(t, rdb)
	name := uniq(t, "x")
	c := startChild(t, "kill-holder", "TestSIGKILLHolder", name)
	tok := c.token()
	if _, err := f.Acquire(ctxT(t), name); !errors.Is(err, ErrLocked) {
		t.Fatalf("while the child holds: %v", err)
	}
	c.p.Kill()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	h, err := f.Acquire(ctx, name, WithWait())
	if err != nil {
		t.Fatalf("after the holder was killed: %v", err)
	}
	if h.Token() <= tok {
		t.Fatalf("token %d not above the killed holder's %d", h.Token(), tok)
	}
	h.Release()
}

// A shared holder's process killed with SIGKILL while a writer waits for
// it frees its share within its TTL, with nobody releasing it: the
// writer, queued behind the placeholder that turns new readers away, gets
// the name with a larger token.
func TestSIGKILLSharedHolder(t *testing.T) {
	if testenv.Child() == "kill-shared" {
		childHolder(testenv.RedisAddr(), os.Getenv(childName), time.Second, WithShared())
		return
	}
	rdb := newClient(t)
	f := testFactory(t, rdb)
	name := uniq(t, "x")
	c := startChild(t, "kill-shared", "TestSIGKILLSharedHolder", name)
	tok := c.token()
	r, err := f.Acquire(ctxT(t), name, WithShared())
	if err != nil {
		t.Fatalf("a second reader beside the child: %v", err)
	}
	r.Release()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	type got struct {
		h   *Holder
		err error
	}
	wc := make(chan got, 1)
	go func() {
		h, err := f.Acquire(ctx, name, WithWait())
		wc <- got{h, err}
	}()
	waitJoined(t, f, name, 1)
	if _, err := f.Acquire(ctxT(t), name, WithShared()); !errors.Is(err, ErrLocked) {
		t.Fatalf("a new reader while the writer waits: %v; want ErrLocked", err)
	}
	c.p.Kill()
	w := <-wc
	if w.err != nil {
		t.Fatalf("the writer after the reader was killed: %v", w.err)
	}
	if w.h.Token() <= tok {
		t.Fatalf("writer's token %d not above the killed reader's %d", w.h.Token(), tok)
	}
	w.h.Release()
	r, err = f.Acquire(ctxT(t), name, WithShared())
	if err != nil {
		t.Fatalf("a reader after the writer: %v", err)
	}
	if r.Token() <= w.h.Token() {
		t.Fatalf("reader's token %d not above the writer's %d", r.Token(), w.h.Token())
	}
	r.Release()
}

// While Redis does not answer (CLIENT PAUSE), a renewed holder declares
// the loss by its own clock, while the server still holds the key; after
// the pause the key is removed, not kept alive by a late renewal.
func TestClientPauseHolderGivesUp(t *testing.T) {
	srv := startServer(t)
	admin := dial(t, srv.addr())
	rdb := dial(t, srv.addr())
	f := NewFactory(rdb, WithKeyPrefix(testPrefix), WithTTL(time.Second), WithLogger(nil))
	defer f.Close()
	ctx := ctxT(t)
	name := uniq(t, "x")
	h, err := f.Acquire(ctx, name, WithAutoRenew(true))
	if err != nil {
		t.Fatal(err)
	}
	const pause = 6 * time.Second
	if err := admin.Do(ctx, "CLIENT", "PAUSE", pause.Milliseconds(), "WRITE").Err(); err != nil {
		t.Fatal(err)
	}
	paused := time.Now()
	select {
	case <-h.Done():
	case <-time.After(pause):
		t.Fatal("the holder did not give up while Redis was paused")
	}
	if !errors.Is(h.Err(), ErrLockLost) {
		t.Fatalf("Err = %v", h.Err())
	}
	gaveUp := time.Since(paused)
	// Reads still work during a write pause: the key is still there.
	if n, err := admin.Exists(ctx, h.k.lock).Result(); err != nil || n != 1 {
		t.Fatalf("EXISTS during the pause = %d, %v; the server should still hold the key", n, err)
	}
	admin.Do(ctx, "CLIENT", "UNPAUSE")
	testenv.Eventually(t, 10*time.Second, "key removed after the pause", func() bool {
		n, _ := admin.Exists(ctx, h.k.lock).Result()
		return n == 0
	})
	h2, err := NewFactory(admin, WithKeyPrefix(testPrefix), WithLogger(nil)).Acquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if h2.Token() <= h.Token() {
		t.Fatalf("token %d after %d", h2.Token(), h.Token())
	}
	h2.Release()
	t.Logf("holder (TTL 1s) declared the loss %v into the pause", gaveUp.Round(time.Millisecond))
}

// The holder's connections are killed over and over while renewal runs.
// Either renewal reconnects and keeps the lock, or the holder declares the
// loss before a contender gets in: never two holders at once.
func TestConnectionKilledDuringRenewal(t *testing.T) {
	srv := startServer(t)
	admin := dial(t, srv.addr())
	fh := NewFactory(dial(t, srv.addr()), WithKeyPrefix(testPrefix), WithTTL(600*time.Millisecond), WithLogger(nil))
	fc := NewFactory(dial(t, srv.addr()), WithKeyPrefix(testPrefix), WithTTL(600*time.Millisecond), WithLogger(nil))
	defer fh.Close()
	defer fc.Close()
	ctx := ctxT(t)
	name := uniq(t, "x")
	h, err := fh.Acquire(ctx, name, WithAutoRenew(true))
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var kills, contenderWins atomic.Int32
	var violation atomic.Value
	wg.Add(2)
	go func() { // killer
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			if n, err := admin.ClientKillByFilter(ctx, "TYPE", "normal", "SKIPME", "yes").Result(); err == nil && n > 0 {
				kills.Add(1)
			}
		}
	}()
	go func() { // contender
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
			c, err := fc.Acquire(ctx, name)
			if err != nil {
				continue
			}
			contenderWins.Add(1)
			if !isClosed(h.Done()) {
				violation.Store(fmt.Sprintf("contender got token %d while the holder (token %d) still held", c.Token(), h.Token()))
			}
			c.Release()
		}
	}()
	time.Sleep(3 * time.Second) // five TTLs
	close(stop)
	wg.Wait()
	if v := violation.Load(); v != nil {
		t.Fatal(v)
	}
	if kills.Load() == 0 {
		t.Fatal("no connection was killed")
	}
	if h.Err() == nil {
		t.Logf("%d kill rounds: renewal reconnected and kept the lock; contender got it %d times", kills.Load(), contenderWins.Load())
		if contenderWins.Load() != 0 {
			t.Fatal("contender acquired while the lock was kept")
		}
		if err := h.Release(); err != nil {
			t.Fatal(err)
		}
	} else {
		t.Logf("%d kill rounds: holder declared the loss (%v) before the contender got in (%d times)", kills.Load(), h.Err(), contenderWins.Load())
	}
}

// The pub/sub connection of a waiter is killed: it subscribes again and the
// waiter is still woken by the release.
func TestPubSubConnectionKilled(t *testing.T) {
	srv := startServer(t)
	admin := dial(t, srv.addr())
	f := NewFactory(dial(t, srv.addr()), WithKeyPrefix(testPrefix), WithLogger(nil))
	defer f.Close()
	ctx := ctxT(t)
	name := uniq(t, "x")
	h, err := NewFactory(admin, WithKeyPrefix(testPrefix), WithLogger(nil)).Acquire(ctx, name, WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		w, err := f.Acquire(ctx, name, WithWait())
		if err == nil {
			w.Release()
		}
		got <- err
	}()
	testenv.Eventually(t, 10*time.Second, "waiter subscribed", func() bool { return numsub(t, admin, f.hub.own) == 1 })
	if n, err := admin.ClientKillByFilter(ctx, "TYPE", "pubsub").Result(); err != nil || n != 1 {
		t.Fatalf("CLIENT KILL TYPE pubsub = %d, %v", n, err)
	}
	testenv.Eventually(t, 10*time.Second, "waiter subscribed again", func() bool { return numsub(t, admin, f.hub.own) == 1 })
	h.Release()
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(4 * time.Second): // below maxPoll and the one-minute lease
		t.Fatal("waiter not woken after its pub/sub connection was killed")
	}
}

// The server restarts without persistence: the holder sees the loss and
// does not take the lock again by itself; tokens still increase, because
// they never go below the server clock.
func TestServerRestart(t *testing.T) {
	srv := startServer(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.addr()})
	defer rdb.Close()
	f := NewFactory(rdb, WithKeyPrefix(testPrefix), WithTTL(time.Second), WithLogger(nil))
	defer f.Close()
	ctx := ctxT(t)
	name := uniq(t, "x")
	h, err := f.Acquire(ctx, name, WithAutoRenew(true))
	if err != nil {
		t.Fatal(err)
	}
	srv.kill()
	select {
	case <-h.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("holder did not notice the server was gone")
	}
	if !errors.Is(h.Err(), ErrLockLost) {
		t.Fatalf("Err = %v", h.Err())
	}
	srv.start()
	// Once the factory's renewal has run a pass on the restarted server
	// (it renews a lock taken there), the lost holder would have been
	// renewed or taken again, had it been.
	probe, err := f.Acquire(ctx, uniq(t, "probe"), WithAutoRenew(true))
	if err != nil {
		t.Fatal(err)
	}
	deadline := func() time.Time {
		f.rn.mu.Lock()
		defer f.rn.mu.Unlock()
		return probe.deadline
	}
	first := deadline()
	testenv.Eventually(t, 10*time.Second, "a renewal pass after the restart", func() bool { return deadline().After(first) })
	probe.Release()
	info, err := f.Inspect(ctx, name)
	if err != nil || len(info.Holders) != 0 {
		t.Fatalf("after restart: %+v, %v; the lost holder must not take the lock again", info, err)
	}
	if err := h.Release(); !errors.Is(err, ErrLockLost) {
		t.Fatalf("Release after the restart = %v; want ErrLockLost", err)
	}
	h2, err := f.Acquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	defer h2.Release()
	if h2.Token() <= h.Token() {
		t.Fatalf("token after restart %d not above %d", h2.Token(), h.Token())
	}
}

// A waiter whose ctx is cancelled leaves nothing behind: no subscription,
// no pub/sub connection once idle, no lock.
func TestWaiterCancelLeavesNothing(t *testing.T) {
	const clientName = "redislock-cancel-test"
	rdb := newClient(t)
	wc := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr(), ClientName: clientName})
	defer wc.Close()
	f := NewFactory(wc, WithKeyPrefix(testPrefix), WithLogger(nil))
	defer f.Close()
	holderF := testFactory(t, rdb)
	name := uniq(t, "x")
	h, err := holderF.Acquire(ctxT(t), name)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	got := make(chan error, 1)
	go func() {
		w, err := f.Acquire(ctx, name, WithWait())
		if err == nil {
			w.Release()
		}
		got <- err
	}()
	testenv.Eventually(t, 10*time.Second, "waiter subscribed", func() bool { return numsub(t, rdb, f.hub.own) == 1 })
	cancel()
	err = <-got
	if !errors.Is(err, ErrLocked) || !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled wait = %v; want ErrLocked and context.Canceled", err)
	}
	testenv.Eventually(t, 10*time.Second, "unsubscribed", func() bool { return numsub(t, rdb, f.hub.own) == 0 })
	testenv.Eventually(t, 10*time.Second, "idle pub/sub connection closed", func() bool {
		list, _ := rdb.ClientList(context.Background()).Result()
		for _, line := range strings.Split(list, "\n") {
			// A pub/sub connection: subscribed (flags=P), or last used
			// to subscribe or unsubscribe.
			if strings.Contains(line, " name="+clientName+" ") &&
				(strings.Contains(line, " flags=P ") || strings.Contains(line, "subscribe ")) {
				return false
			}
		}
		return true
	})
	h.Release()
	info, err := f.Inspect(ctxT(t), name)
	if err != nil || len(info.Holders) != 0 {
		t.Fatalf("after the cancelled wait and the release: %+v, %v; want nothing held", info, err)
	}
}

// warnLines is a slog handler that counts the Warn (and higher) records
// about one lock name.
type warnLines struct {
	name string
	mu   sync.Mutex
	msgs []string
}

func (w *warnLines) Enabled(context.Context, slog.Level) bool { return true }
func (w *warnLines) Handle(_ context.Context, r slog.Record) error {
	if r.Level < slog.LevelWarn {
		return nil
	}
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "name" && a.Value.String() == w.name {
			w.mu.Lock()
			w.msgs = append(w.msgs, fmt.Sprintf("%s %v", r.Message, r.Level))
			w.mu.Unlock()
		}
		return true
	})
	return nil
}
func (w *warnLines) WithAttrs([]slog.Attr) slog.Handler { return w }
func (w *warnLines) WithGroup(string) slog.Handler      { return w }

// A renewed lock that is lost is one Warn line, whether its renewals
// failed until the lease ran out (the server is gone) or a renewal found
// the key gone; a loss to Close is none.
func TestRenewalLossIsOneWarn(t *testing.T) {
	for _, how := range []string{"server killed", "key deleted", "closed"} {
		t.Run(how, func(t *testing.T) {
			srv := startServer(t)
			// No retries: a renewal fails at once once the server is
			// gone, and is retried by the renewal loop until the lease
			// runs out.
			rdb := redis.NewClient(&redis.Options{Addr: srv.addr(), MaxRetries: -1, DialerRetries: 1})
			t.Cleanup(func() { rdb.Close() })
			log := &warnLines{name: uniq(t, "x")}
			f := NewFactory(rdb, WithKeyPrefix(testPrefix), WithTTL(2*time.Second), WithLogger(slog.New(log)))
			h, err := f.Acquire(ctxT(t), log.name, WithAutoRenew(true))
			if err != nil {
				t.Fatal(err)
			}
			switch how {
			case "server killed":
				srv.kill()
			case "key deleted":
				if err := dial(t, srv.addr()).Del(ctxT(t), h.k.lock).Err(); err != nil {
					t.Fatal(err)
				}
			case "closed":
				f.Close()
			}
			select {
			case <-h.Done():
			case <-time.After(30 * time.Second):
				t.Fatal("the loss was not noticed")
			}
			f.Close() // waits for the renewal goroutines: no line comes later
			want := 1
			if how == "closed" {
				want = 0
			}
			log.mu.Lock()
			defer log.mu.Unlock()
			t.Logf("loss: %v", h.Err())
			if len(log.msgs) != want {
				t.Errorf("%d Warn lines, want %d: %q (Err %v)", len(log.msgs), want, log.msgs, h.Err())
			}
		})
	}
}

// A writer's process killed while it waits for readers takes its
// preference with it: the placeholder that turns readers away ends within
// two of its TTLs, and a reader waiting behind it gets in.
func TestSIGKILLWaitingWriter(t *testing.T) {
	if testenv.Child() == "kill-writer" {
		rdb := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr()})
		f := NewFactory(rdb, WithKeyPrefix(testPrefix), WithTTL(time.Second), WithLogger(nil))
		fmt.Println("child: waiting")
		h, err := f.Acquire(context.Background(), os.Getenv(childName), WithWait())
		fmt.Printf("child: acquired %v\n", err == nil && h != nil)
		os.Exit(1)
	}
	rdb := newClient(t)
	f := testFactory(t, rdb, WithTTL(time.Minute))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	name := uniq(t, "x")
	r, err := f.Acquire(ctx, name, WithShared())
	if err != nil {
		t.Fatal(err)
	}
	defer r.Release()
	c := startChild(t, "kill-writer", "TestSIGKILLWaitingWriter", name)
	if l := c.line(); l != "waiting" {
		t.Fatalf("child said %q", l)
	}
	testenv.Eventually(t, 30*time.Second, "the child writer queued", func() bool {
		info, err := f.Inspect(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		return info.Waiting == 1
	})
	if _, err := f.Acquire(ctx, name, WithShared()); !errors.Is(err, ErrLocked) {
		t.Fatalf("a reader while the child writer waits: %v; want ErrLocked", err)
	}
	c.p.Kill()
	r2, err := f.Acquire(ctx, name, WithShared(), WithWait())
	if err != nil {
		t.Fatalf("a reader after the waiting writer was killed: %v", err)
	}
	r2.Release()
}
