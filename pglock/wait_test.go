package pglock_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
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

// counter counts the statements sent on the connections of a pool, its
// hijacked lock sessions included: each is one transaction on the server
// (xact_commit or xact_rollback), without another client's noise.
type counter struct{ n atomic.Int64 }

func (c *counter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}

func (c *counter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// waiters returns how many sessions wait for name in Postgres: blocked in
// the queue of its mutex key, or marking it as waited for.
func waiters(t testing.TB, pool *pgxpool.Pool, name string) int {
	var n int
	if err := pool.QueryRow(ctxT(t), `SELECT count(*) FROM (`+waiterPIDs+`) w`, name).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// advisoryOf returns how many advisory locks of name's mutex key
// pg_locks shows, granted or waited for, by any session.
func advisoryOf(t testing.TB, pool *pgxpool.Pool, name string) int {
	var n int
	if err := pool.QueryRow(ctxT(t), `SELECT count(*) FROM pg_locks l WHERE l.locktype = 'advisory' AND l.objsubid = 1
		AND (l.classid::int8 << 32) | l.objid::int8 = public.pglock_key('m', '', $1)`, name).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// With 8 waiting processes (each its own factory and pool) an acquisition
// costs at most 3 statements: the try that found the name held, the wait
// that Postgres grants, the release. Waiters that all retry on every
// release (the notified path) cost several times that.
func TestWaitStatementsPerAcquisition(t *testing.T) {
	const workers, rounds = 8, 40
	name := uniq(t)
	var c counter
	fs := make([]*pglock.Factory, workers)
	for i := range fs {
		pool := newPool(t, func(cfg *pgxpool.Config) { cfg.ConnConfig.Tracer = &c })
		// Health checks are server work too, but per second, not per
		// acquisition: off here so that the count is the acquisitions'.
		fs[i] = newFactory(t, pool, pglock.WithHealthInterval(time.Hour))
		h, err := fs[i].Acquire(ctxT(t), name, pglock.WithWait()) // opens the lock session
		if err != nil {
			t.Fatal(err)
		}
		h.Release()
	}
	// Every factory opens its wait session once before counting.
	run := func(rounds int) {
		var wg sync.WaitGroup
		errs := make(chan error, workers)
		for _, f := range fs {
			wg.Go(func() {
				for range rounds {
					h, err := f.Acquire(ctxT(t), name, pglock.WithWait())
					if err != nil {
						errs <- err
						return
					}
					if err := h.Release(); err != nil {
						errs <- err
						return
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
	}
	run(5)
	c.n.Store(0)
	run(rounds)
	per := float64(c.n.Load()) / (workers * rounds)
	t.Logf("%d waiting factories: %.2f statements per acquisition", workers, per)
	if per > 3 {
		t.Fatalf("%.2f statements per acquisition with %d waiting factories; want at most 3", per, workers)
	}
}

// A waiting process killed with SIGKILL while blocked leaves the queue with
// its connection: the next waiter gets the lock at the release, and once
// every holder released nothing of the name is left in pg_locks.
func TestSIGKILLWhileWaiting(t *testing.T) {
	if testenv.Child() == "pglock-waiter" {
		pool := newPool(t)
		f := pglock.NewFactory(pool, pglock.WithLogger(nil))
		fmt.Println("WAITING")
		_, err := f.Acquire(context.Background(), os.Getenv("PGLOCK_TEST_NAME"), pglock.WithWait())
		fmt.Println("GOT", err) // never: it is killed first
		select {}
	}
	pool := newPool(t)
	name := uniq(t)
	h, err := newFactory(t, pool).Acquire(ctxT(t), name)
	if err != nil {
		t.Fatal(err)
	}
	cmd := testenv.Command(t, "pglock-waiter", "TestSIGKILLWhileWaiting", "PGLOCK_TEST_NAME="+name)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	sc := bufio.NewScanner(out)
	for sc.Scan() && !strings.HasPrefix(sc.Text(), "WAITING") {
	}
	go io.Copy(io.Discard, out)
	testenv.Eventually(t, 20*time.Second, "child waiting", func() bool { return waiters(t, pool, name) == 1 })
	// A waiter behind the child, in this process.
	got := make(chan error, 1)
	go func() {
		w, err := newFactory(t, newPool(t), pglock.WithPollInterval(time.Hour)).Acquire(ctxT(t), name, pglock.WithWait())
		if err == nil {
			err = w.Release()
		}
		got <- err
	}()
	testenv.Eventually(t, 20*time.Second, "second waiter waiting", func() bool { return waiters(t, pool, name) == 2 })
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	testenv.Eventually(t, 20*time.Second, "the killed waiter gone from the queue", func() bool { return waiters(t, pool, name) == 1 })
	h.Release()
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the waiter behind a killed one did not get the lock at the release")
	}
	testenv.Eventually(t, 20*time.Second, "no advisory lock of the name", func() bool { return advisoryOf(t, pool, name) == 0 })
}

// A blocked waiter whose context ends returns with a wait error and
// leaves nothing in Postgres: neither its place in the queue nor a grant
// that raced the cancel.
func TestWaitCancelledLeavesNothing(t *testing.T) {
	pool := newPool(t)
	name := uniq(t)
	holder := newFactory(t, pool)
	waiter := newFactory(t, newPool(t), pglock.WithPollInterval(time.Hour))
	other := newFactory(t, newPool(t))
	h, err := holder.Acquire(ctxT(t), name)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	got := make(chan error, 1)
	go func() {
		_, err := waiter.Acquire(ctx, name, pglock.WithWait())
		got <- err
	}()
	testenv.Eventually(t, 20*time.Second, "waiter blocked", func() bool { return waiters(t, pool, name) == 1 })
	cancel()
	if err := <-got; !errors.Is(err, pglock.ErrLocked) || !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled wait = %v; want a wait error matching ErrLocked and context.Canceled", err)
	}
	if n := waiters(t, pool, name); n != 0 {
		t.Fatalf("%d sessions still wait for the name after the cancelled wait", n)
	}
	h.Release()
	if !acquired(t, other, name) {
		t.Fatal("the name is not free after the holder released and the waiter gave up")
	}

	// The cancel racing the grant: the release and the cancel at once.
	// Whichever wins, nothing is left held once all is done.
	for i := range 30 {
		h, err := holder.Acquire(ctxT(t), name)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		got := make(chan error, 1)
		go func() {
			w, err := waiter.Acquire(ctx, name, pglock.WithWait())
			if err == nil {
				err = w.Release()
			}
			got <- err
		}()
		testenv.Eventually(t, 20*time.Second, "waiter blocked", func() bool { return waiters(t, pool, name) == 1 })
		go cancel()
		h.Release()
		if err := <-got; err != nil && !errors.Is(err, context.Canceled) {
			t.Fatalf("round %d: %v", i, err)
		}
		if !acquired(t, other, name) {
			t.Fatalf("round %d: the name is still held after a cancel raced its grant (pg_locks: %d)", i, advisoryOf(t, pool, name))
		}
	}
	if n := advisoryOf(t, pool, name); n != 0 {
		t.Fatalf("%d advisory locks of the name left", n)
	}
}

// Close while a waiter blocks: the wait ends with ErrClosed at once and
// the factory leaves nothing in the queue.
func TestCloseWhileBlocked(t *testing.T) {
	pool := newPool(t)
	name := uniq(t)
	h, err := newFactory(t, pool).Acquire(ctxT(t), name)
	if err != nil {
		t.Fatal(err)
	}
	f := newFactory(t, newPool(t), pglock.WithPollInterval(time.Hour))
	got := make(chan error, 1)
	go func() {
		_, err := f.Acquire(ctxT(t), name, pglock.WithWait())
		got <- err
	}()
	testenv.Eventually(t, 20*time.Second, "waiter blocked", func() bool { return waiters(t, pool, name) == 1 })
	f.Close()
	select {
	case err := <-got:
		if !errors.Is(err, lock.ErrClosed) {
			t.Fatalf("wait ended by Close = %v; want ErrClosed", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Close did not end the blocked wait")
	}
	testenv.Eventually(t, 20*time.Second, "the closed factory gone from the queue", func() bool { return waiters(t, pool, name) == 0 })
	h.Release()
	if n := advisoryOf(t, pool, name); n != 0 {
		t.Fatalf("%d advisory locks of the name left after the release", n)
	}
}
