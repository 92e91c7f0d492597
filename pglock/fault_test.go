package pglock_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/ubgo/lock"
	"github.com/ubgo/lock/internal/testenv"
	"github.com/ubgo/lock/pglock"
)

func acquired(t testing.TB, f *pglock.Factory, name string) bool {
	h, err := f.Acquire(ctxT(t), name)
	if err != nil {
		if !errors.Is(err, pglock.ErrLocked) {
			t.Logf("Acquire(%q): %v", name, err)
		}
		return false
	}
	h.Release()
	return true
}

// pg_terminate_backend on the lock session: every holder on it sees the
// loss, WithLock's context is cancelled, another client acquires, and the
// factory opens a new session for later calls.
func TestTerminatedSessionLosesEveryHolder(t *testing.T) {
	pool := newPool(t)
	f := newFactory(t, pool, pglock.WithSessions(1), pglock.WithHealthInterval(100*time.Millisecond))
	other := newFactory(t, pool)
	base := uniq(t)
	var hs []*pglock.Holder
	for i := 0; i < 5; i++ {
		h, err := f.Acquire(ctxT(t), fmt.Sprint(base, "/", i))
		if err != nil {
			t.Fatal(err)
		}
		hs = append(hs, h)
	}
	fnErr := make(chan error, 1)
	started := make(chan uint32, 1)
	go func() {
		fnErr <- f.WithLock(ctxT(t), base+"/withlock", func(ctx context.Context) error {
			started <- 0
			<-ctx.Done()
			if !errors.Is(context.Cause(ctx), lock.ErrLockLost) {
				return fmt.Errorf("cause %v, want ErrLockLost", context.Cause(ctx))
			}
			return ctx.Err()
		})
	}()
	<-started
	terminate(t, pool, hs[0].BackendPID())
	for _, h := range hs {
		select {
		case <-h.Done():
		case <-time.After(10 * time.Second):
			t.Fatal("holder not told of the loss within 10s")
		}
		if !errors.Is(h.Err(), pglock.ErrLockLost) || !errors.Is(h.Err(), lock.ErrLockLost) {
			t.Fatalf("Err = %v", h.Err())
		}
		if err := h.Release(); !errors.Is(err, lock.ErrLockLost) {
			t.Fatalf("Release after loss = %v", err)
		}
	}
	if err := <-fnErr; !errors.Is(err, lock.ErrLockLost) || !errors.Is(err, context.Canceled) {
		t.Fatalf("WithLock = %v; want ErrLockLost and context.Canceled", err)
	}
	// The server tells the client before its backend has exited and let
	// go of the locks: they are free moments later, not at once.
	for i := range hs {
		testenv.Eventually(t, 15*time.Second, fmt.Sprintf("lock %d free after its session ended", i), func() bool {
			return acquired(t, other, fmt.Sprint(base, "/", i))
		})
	}
	h, err := f.Acquire(ctxT(t), base+"/after")
	if err != nil {
		t.Fatalf("the factory did not recover: %v", err)
	}
	h.Release()
}

// A holder process killed with SIGKILL: its session ends with it and
// Postgres frees the lock.
func TestSIGKILLFreesLock(t *testing.T) {
	if testenv.Child() == "pglock-holder" {
		holdForever(t)
		return
	}
	pool := newPool(t)
	name := uniq(t)
	cmd := testenv.Command(t, "pglock-holder", "TestSIGKILLFreesLock", "PGLOCK_TEST_NAME="+name)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	var token uint64
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) == 2 && f[0] == "HELD" {
			token, _ = strconv.ParseUint(f[1], 10, 64)
			break
		}
	}
	if token == 0 {
		t.Fatalf("child did not report holding the lock: %v", sc.Err())
	}
	go io.Copy(io.Discard, out)
	f := newFactory(t, pool)
	if _, err := f.Acquire(ctxT(t), name); !errors.Is(err, pglock.ErrLocked) {
		t.Fatalf("Acquire while the child holds it: %v", err)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	var h *pglock.Holder
	testenv.Eventually(t, 20*time.Second, "lock freed after SIGKILL", func() bool {
		var err error
		h, err = f.Acquire(ctxT(t), name)
		return err == nil
	})
	if h.Token() <= token {
		t.Fatalf("token %d after the killed holder's %d", h.Token(), token)
	}
	h.Release()
}

func holdForever(t *testing.T) {
	pool := newPool(t)
	f := pglock.NewFactory(pool)
	h, err := f.Acquire(context.Background(), os.Getenv("PGLOCK_TEST_NAME"))
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("HELD %d\n", h.Token())
	select {}
}

// Release does not depend on the caller's context: with it cancelled, the
// lock is still gone from pg_locks afterwards.
func TestReleaseAfterCancelLeavesNothing(t *testing.T) {
	pool := newPool(t)
	f := newFactory(t, pool)
	name := uniq(t)
	ctx, cancel := context.WithCancel(context.Background())
	h, err := f.Acquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := h.Release(); err != nil {
		t.Fatal(err)
	}
	if pids := heldBy(t, pool, name); len(pids) != 0 {
		t.Fatalf("pg_locks shows the lock held by %v after Release", pids)
	}
	// The same inside WithLock whose context is cancelled while fn runs.
	ctx, cancel = context.WithCancel(context.Background())
	err = f.WithLock(ctx, name, func(ctx context.Context) error {
		cancel()
		<-ctx.Done()
		return ctx.Err()
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("WithLock = %v", err)
	}
	if pids := heldBy(t, pool, name); len(pids) != 0 {
		t.Fatalf("pg_locks shows the lock held by %v after WithLock", pids)
	}
}

// An exhausted pool is a clear error in bounded time; once the factory's
// sessions are open, locking no longer needs the pool at all.
func TestPoolExhaustion(t *testing.T) {
	pool := newPool(t, func(c *pgxpool.Config) { c.MaxConns = 1 })
	busy, err := pool.Acquire(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	f := newFactory(t, pool, pglock.WithSessions(1), pglock.WithConnectTimeout(300*time.Millisecond), pglock.WithPollInterval(100*time.Millisecond))
	name := uniq(t)
	start := time.Now()
	_, err = f.Acquire(context.Background(), name)
	if !errors.Is(err, pglock.ErrPoolExhausted) || time.Since(start) > 30*time.Second {
		t.Fatalf("Acquire on an exhausted pool = %v after %v; want ErrPoolExhausted", err, time.Since(start))
	}
	t.Logf("exhausted pool: %v", err)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	_, err = newFactory(t, pool, pglock.WithConnectTimeout(time.Hour)).Acquire(ctx, name)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire with a short ctx on an exhausted pool = %v; want DeadlineExceeded", err)
	}
	busy.Release()

	h, err := f.Acquire(ctxT(t), name)
	if err != nil {
		t.Fatal(err)
	}
	busy, err = pool.Acquire(ctxT(t)) // the pool is exhausted again
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Release()
	if _, err := f.Acquire(ctxT(t), name); !errors.Is(err, pglock.ErrLocked) {
		t.Fatalf("contention on an exhausted pool = %v; want ErrLocked at once", err)
	}
	got := make(chan error, 1)
	go func() {
		w, err := f.Acquire(ctxT(t), name, pglock.WithWait())
		if err == nil {
			err = w.Release()
		}
		got <- err
	}()
	time.Sleep(50 * time.Millisecond)
	h.Release()
	if err := <-got; err != nil {
		t.Fatalf("waiter on an exhausted pool: %v", err)
	}
	h2, err := f.Acquire(ctxT(t), name+"/other")
	if err != nil {
		t.Fatalf("Acquire on an exhausted pool with the session open: %v", err)
	}
	h2.Release()
}

// proxy forwards TCP to Postgres and can cut the network: bytes are then
// dropped in both directions while the sockets stay open, as with a
// partition.
type proxy struct {
	ln  net.Listener
	cut atomic.Bool

	mu     sync.Mutex
	conns  []net.Conn
	refuse bool // new connections are closed at once (see drop and close)
}

func startProxy(t testing.TB, upstream string) *proxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", upstream)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			refuse := p.refuse
			p.conns = append(p.conns, c, u)
			p.mu.Unlock()
			if refuse {
				c.Close()
				u.Close()
				continue
			}
			go p.pipe(c, u)
			go p.pipe(u, c)
		}
	}()
	t.Cleanup(p.close)
	return p
}

// pipe copies until either side closes, then closes both: a client that
// closes its connection ends the server's session too.
func (p *proxy) pipe(from, to net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := from.Read(buf)
		if n > 0 && !p.cut.Load() {
			if _, werr := to.Write(buf[:n]); werr != nil {
				break
			}
		}
		if err != nil {
			break
		}
	}
	from.Close()
	to.Close()
}

func (p *proxy) port() uint16 { return uint16(p.ln.Addr().(*net.TCPAddr).Port) }

// drop closes every connection through the proxy and refuses new ones, as
// a server that went away would.
func (p *proxy) drop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.refuse = true
	for _, c := range p.conns {
		c.Close()
	}
}

func (p *proxy) close() {
	p.ln.Close()
	p.drop()
}

// With the network cut, the health check runs out, the holder is told,
// and the session is closed, which (once the close reaches the server)
// frees the lock. A Release during the cut gives up the same way.
func TestNetworkCut(t *testing.T) {
	direct := newPool(t)
	cfg, err := pgxpool.ParseConfig(testenv.PostgresDSN())
	if err != nil {
		t.Fatal(err)
	}
	p := startProxy(t, fmt.Sprintf("%s:%d", cfg.ConnConfig.Host, cfg.ConnConfig.Port))
	pool := newPool(t, func(c *pgxpool.Config) { c.ConnConfig.Host, c.ConnConfig.Port = "127.0.0.1", p.port() })
	f := newFactory(t, pool, pglock.WithSessions(1), pglock.WithHealthInterval(100*time.Millisecond), pglock.WithStatementTimeout(500*time.Millisecond))
	other := newFactory(t, direct)
	name := uniq(t)
	held, err := f.Acquire(ctxT(t), name)
	if err != nil {
		t.Fatal(err)
	}
	released, err := f.Acquire(ctxT(t), name+"/released")
	if err != nil {
		t.Fatal(err)
	}
	p.cut.Store(true)
	cutAt := time.Now()
	relErr := make(chan error, 1)
	go func() { relErr <- released.Release() }()
	select {
	case <-held.Done():
	case <-time.After(15 * time.Second):
		t.Fatal("loss not noticed within 15s of the cut")
	}
	t.Logf("loss noticed %v after the cut", time.Since(cutAt))
	if !errors.Is(held.Err(), pglock.ErrLockLost) {
		t.Fatalf("Err = %v", held.Err())
	}
	if err := <-relErr; err == nil {
		t.Fatal("Release during the cut reported success")
	} else {
		t.Logf("Release during the cut: %v", err)
	}
	for _, n := range []string{name, name + "/released"} {
		testenv.Eventually(t, 15*time.Second, "lock freed after the session was closed", func() bool { return acquired(t, other, n) })
	}
	t.Logf("locks free %v after the cut", time.Since(cutAt))
}

// With the network cut, every lock session is found lost within the one
// documented bound, health interval + statement timeout, whatever the
// number of sessions: they are checked at the same time, not one after
// another.
//
// The bound asserted is deliberately loose. With health interval H and
// statement timeout S, each holder should learn of the loss within H + S
// of the cut (plus a few milliseconds). Checked one after another, session
// k (1-based) is declared lost only after H + k×S: the third and fourth of
// four sessions after at least H + 3S. The test asserts every loss within
// H + 2S: with S = 2s that is 2s (a whole statement timeout) above where
// a correct check lands, and 2s below where the sequential one could land
// for the last two sessions, so neither scheduling noise nor the machine's
// load decides the outcome.
func TestNetworkCutEverySessionWithinBound(t *testing.T) {
	const (
		sessions = 4
		health   = 200 * time.Millisecond
		stmt     = 2 * time.Second
		bound    = health + 2*stmt
	)
	cfg, err := pgxpool.ParseConfig(testenv.PostgresDSN())
	if err != nil {
		t.Fatal(err)
	}
	p := startProxy(t, fmt.Sprintf("%s:%d", cfg.ConnConfig.Host, cfg.ConnConfig.Port))
	pool := newPool(t, func(c *pgxpool.Config) { c.ConnConfig.Host, c.ConnConfig.Port = "127.0.0.1", p.port() })
	f := newFactory(t, pool, pglock.WithSessions(sessions), pglock.WithHealthInterval(health), pglock.WithStatementTimeout(stmt))
	// One holder on each session: names map to sessions by their key, so
	// take names until every session (backend pid) holds one.
	base := uniq(t)
	bySession := map[uint32]*pglock.Holder{}
	for i := 0; len(bySession) < sessions; i++ {
		if i == 1000 {
			t.Fatalf("only %d of %d sessions got a holder in 1000 names", len(bySession), sessions)
		}
		h, err := f.Acquire(ctxT(t), fmt.Sprint(base, "/", i))
		if err != nil {
			t.Fatal(err)
		}
		if bySession[h.BackendPID()] != nil {
			h.Release()
			continue
		}
		bySession[h.BackendPID()] = h
	}
	p.cut.Store(true)
	cutAt := time.Now()
	lostAfter := make(chan time.Duration, sessions)
	for _, h := range bySession {
		go func() {
			select {
			case <-h.Done():
				lostAfter <- time.Since(cutAt)
			case <-time.After(time.Minute):
				lostAfter <- -1
			}
		}()
	}
	var late []time.Duration
	for range sessions {
		d := <-lostAfter
		t.Logf("holder told of the loss %v after the cut", d)
		if d < 0 || d > bound {
			late = append(late, d)
		}
	}
	if len(late) > 0 {
		t.Fatalf("%d of %d holders told later than %v (health %v + 2 × statement timeout %v; -1: not within a minute): %v",
			len(late), sessions, bound, health, stmt, late)
	}
	for _, h := range bySession {
		if !errors.Is(h.Err(), pglock.ErrLockLost) {
			t.Fatalf("Err = %v", h.Err())
		}
	}
}

// proxied returns a pool whose connections go through a new proxy to the
// test server.
func proxied(t testing.TB, configure ...func(*pgxpool.Config)) (*proxy, *pgxpool.Pool) {
	cfg, err := pgxpool.ParseConfig(testenv.PostgresDSN())
	if err != nil {
		t.Fatal(err)
	}
	p := startProxy(t, fmt.Sprintf("%s:%d", cfg.ConnConfig.Host, cfg.ConnConfig.Port))
	via := func(c *pgxpool.Config) { c.ConnConfig.Host, c.ConnConfig.Port = "127.0.0.1", p.port() }
	pool := newPool(t, append(configure, via)...)
	// Before the pool closes: its connections then end at once, instead of
	// pgx waiting on a silent server to close one that timed out.
	t.Cleanup(p.close)
	return p, pool
}

// A server that does not answer (the network to it frozen) is an outage,
// said as such: a new Acquire fails by WithConnectTimeout,
// WithStatementTimeout or its ctx deadline with an error naming the
// missing answer, which matches neither ErrPoolExhausted (the pool has
// connections to spare) nor ErrLocked, with or without WithWait. The
// factory meets the silence wherever it first asks: pinging an idle pool
// connection, connecting a new one, opening a lock session on an idle one
// pgxpool did not ping, or on the lock session it has open.
func TestFrozenServerAcquire(t *testing.T) {
	states := []struct {
		name    string
		ping    bool // pgxpool pings the idle connection (as one idle over a second)
		reset   bool // the pool has no connection: a new one is connected
		session bool // the factory has its lock session open
	}{
		{name: "pinged idle connection", ping: true},
		{name: "new connection", reset: true},
		{name: "idle connection"},
		{name: "open session", session: true},
	}
	bounds := []struct {
		name                    string
		connect, stmt, deadline time.Duration
		wait                    bool
	}{
		{"timeouts", 500 * time.Millisecond, 500 * time.Millisecond, time.Minute, false},
		{"timeouts, waiting", 500 * time.Millisecond, 500 * time.Millisecond, time.Minute, true},
		{"ctx deadline", time.Minute, 2 * time.Second, 500 * time.Millisecond, false},
	}
	for _, st := range states {
		for _, b := range bounds {
			t.Run(st.name+", "+b.name, func(t *testing.T) {
				p, pool := proxied(t, func(c *pgxpool.Config) {
					if st.ping {
						c.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return true }
					}
				})
				f := newFactory(t, pool, pglock.WithConnectTimeout(b.connect), pglock.WithStatementTimeout(b.stmt),
					pglock.WithHealthInterval(time.Hour))
				name := uniq(t) // the same name, so the same lock session
				if st.session && !acquired(t, f, name) {
					t.Fatal("no lock before the freeze")
				}
				if st.reset {
					pool.Reset()
				}
				var opts []pglock.Option
				if b.wait {
					opts = append(opts, pglock.WithWait())
				}
				p.cut.Store(true)
				ctx, cancel := context.WithTimeout(context.Background(), b.deadline)
				defer cancel()
				start := time.Now()
				_, err := f.Acquire(ctx, name, opts...)
				t.Logf("Acquire after %v: %v", time.Since(start).Round(time.Millisecond), err)
				switch {
				case err == nil:
					t.Fatal("Acquire succeeded on a server that does not answer")
				case errors.Is(err, lock.ErrLocked), errors.Is(err, pglock.ErrPoolExhausted):
					t.Fatalf("Acquire = %v; want an outage, not contention or an exhausted pool", err)
				case !strings.Contains(err.Error(), "no answer"):
					t.Fatalf("Acquire = %q; want it to name the missing answer", err)
				case !b.wait && !strings.HasPrefix(err.Error(), "pglock: "):
					t.Fatalf("Acquire = %q; want \"pglock: <what>: <detail>\"", err)
				}
			})
		}
	}
}

// A waiter whose connections close under it (the server went away) gets
// an error in the documented form, "pglock: <what>: <detail>", never
// contention.
func TestWaiterConnectionDropped(t *testing.T) {
	direct := newPool(t)
	p, pool := proxied(t)
	name := uniq(t)
	h, err := newFactory(t, direct).Acquire(ctxT(t), name)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Release()
	// No health check: the waiter is the one to find the sessions gone.
	f := newFactory(t, pool, pglock.WithHealthInterval(time.Hour))
	got := make(chan error, 1)
	go func() {
		w, err := f.Acquire(ctxT(t), name, pglock.WithWait())
		if err == nil {
			w.Release()
		}
		got <- err
	}()
	testenv.Eventually(t, 20*time.Second, "waiter blocked", func() bool { return waiters(t, direct, name) == 1 })
	p.drop()
	select {
	case err := <-got:
		t.Logf("waiter: %v", err)
		if err == nil || errors.Is(err, lock.ErrLocked) || !strings.HasPrefix(err.Error(), "pglock: ") {
			t.Fatalf("waiter whose connections closed = %q; want an error starting \"pglock: \", not ErrLocked", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the waiter did not return within 30s of its connections closing")
	}
}

// A server that ends idle sessions (idle_session_timeout, here set for the
// pool's connections) does not end a lock session between its health
// checks, with the locks it holds.
func TestIdleSessionTimeoutKeepsLocks(t *testing.T) {
	pool := newPool(t, func(c *pgxpool.Config) {
		c.ConnConfig.RuntimeParams["idle_session_timeout"] = "200"
	})
	var version int
	if err := pool.QueryRow(ctxT(t), "SELECT current_setting('server_version_num')::int").Scan(&version); err != nil {
		t.Fatal(err)
	}
	if version < 140000 {
		t.Skipf("PostgreSQL %d has no idle_session_timeout", version)
	}
	f := newFactory(t, pool, pglock.WithHealthInterval(5*time.Second))
	name := uniq(t)
	h, err := f.Acquire(ctxT(t), name)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Release()
	// Idle for three times the server's timeout: it would have ended it.
	watch := newPool(t)
	testenv.Eventually(t, 15*time.Second, "the lock session idle for 600ms", func() bool {
		var idle bool
		err := watch.QueryRow(ctxT(t), "SELECT state = 'idle' AND now() - state_change > interval '600 ms' FROM pg_stat_activity WHERE pid = $1", h.BackendPID()).Scan(&idle)
		if errors.Is(err, pgx.ErrNoRows) {
			t.Fatalf("the lock session (pid %d) ended while idle", h.BackendPID())
		}
		return err == nil && idle
	})
	select {
	case <-h.Done():
		t.Fatalf("lost: %v", h.Err())
	default:
	}
	if _, err := newFactory(t, watch).Acquire(ctxT(t), name); !errors.Is(err, lock.ErrLocked) {
		t.Fatalf("another factory's Acquire = %v; want ErrLocked", err)
	}
}
