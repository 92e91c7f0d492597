package pglock_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/ubgo/lock"
	"github.com/ubgo/lock/internal/testenv"
	"github.com/ubgo/lock/pglock"
)

// Readers and writers that wait with a wait session wait in Postgres's
// own queue of the name's mutex key: their requests show in pg_locks, not
// granted, in the mode they asked for.

// queuedModes returns the modes of the requests for name's mutex key that
// wait in Postgres's queue (not granted).
func queuedModes(t testing.TB, pool *pgxpool.Pool, name string) []string {
	t.Helper()
	rows, err := pool.Query(ctxT(t), `SELECT l.mode FROM pg_locks l WHERE l.locktype = 'advisory' AND l.objsubid = 1
		AND NOT l.granted AND (l.classid::int8 << 32) | l.objid::int8 = public.pglock_key('m', '', $1)`, name)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var modes []string
	for rows.Next() {
		var m string
		if err := rows.Scan(&m); err != nil {
			t.Fatal(err)
		}
		modes = append(modes, m)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return modes
}

// untilQueued returns once n requests for name wait in Postgres's queue.
func untilQueued(t testing.TB, pool *pgxpool.Pool, name string, n int) []string {
	t.Helper()
	var modes []string
	if !testenv.Poll(30*time.Second, func() bool { modes = queuedModes(t, pool, name); return len(modes) >= n }) {
		t.Fatalf("after 30s %d requests for %q wait in Postgres's queue (%v); want %d", len(modes), name, modes, n)
	}
	return modes
}

type queuedResult struct {
	h   *pglock.Holder
	err error
}

func acquireAsync(ctx context.Context, f *pglock.Factory, name string, opts ...pglock.Option) <-chan queuedResult {
	c := make(chan queuedResult, 1)
	go func() {
		h, err := f.Acquire(ctx, name, append([]pglock.Option{pglock.WithWait()}, opts...)...)
		c <- queuedResult{h, err}
	}()
	return c
}

// A reader waiting for a writer waits in Postgres's queue (a ShareLock not
// granted), and so does a writer behind it; at the release Postgres grants
// the queued readers together, and the writer queued behind them waits
// for both.
func TestReadersWaitInPostgresQueue(t *testing.T) {
	pool := newPool(t)
	name := uniq(t)
	ctx := ctxT(t)
	w1 := newFactory(t, pool)
	x, err := w1.Acquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	r1 := acquireAsync(ctx, newFactory(t, pool), name, lock.WithShared())
	r2 := acquireAsync(ctx, newFactory(t, pool), name, lock.WithShared())
	if modes := untilQueued(t, pool, name, 2); modes[0] != "ShareLock" || modes[1] != "ShareLock" {
		t.Fatalf("queued requests %v; want two ShareLocks", modes)
	}
	w2 := acquireAsync(ctx, newFactory(t, pool), name)
	untilQueued(t, pool, name, 3)
	if err := x.Release(); err != nil {
		t.Fatal(err)
	}
	a, b := <-r1, <-r2
	if a.err != nil || b.err != nil {
		t.Fatalf("queued readers: %v, %v", a.err, b.err)
	}
	if a.h.Token() <= x.Token() || b.h.Token() <= x.Token() {
		t.Errorf("readers' tokens %d, %d not above the writer's %d", a.h.Token(), b.h.Token(), x.Token())
	}
	select {
	case got := <-w2:
		t.Fatalf("the writer queued behind two readers got the lock while they hold it (%v)", got.err)
	case <-time.After(50 * time.Millisecond):
	}
	a.h.Release()
	b.h.Release()
	got := <-w2
	if got.err != nil {
		t.Fatal(got.err)
	}
	if got.h.Token() <= max(a.h.Token(), b.h.Token()) {
		t.Errorf("writer's token %d not above the readers' %d, %d", got.h.Token(), a.h.Token(), b.h.Token())
	}
	got.h.Release()
}

// A reader that comes while a writer waits in Postgres's queue behind
// readers queues behind that writer (Postgres's writer preference), and
// gets the name only once the writer released it.
func TestReaderQueuesBehindWaitingWriter(t *testing.T) {
	pool := newPool(t)
	name := uniq(t)
	ctx := ctxT(t)
	r0, err := newFactory(t, pool).Acquire(ctx, name, lock.WithShared())
	if err != nil {
		t.Fatal(err)
	}
	w := acquireAsync(ctx, newFactory(t, pool), name)
	untilQueued(t, pool, name, 1)
	r := acquireAsync(ctx, newFactory(t, pool), name, lock.WithShared())
	// pg_locks does not list them in the queue's order: what follows
	// shows it.
	if modes := untilQueued(t, pool, name, 2); !slices.Contains(modes, "ExclusiveLock") || !slices.Contains(modes, "ShareLock") {
		t.Fatalf("queued requests %v; want the writer's and the reader's", modes)
	}
	r0.Release()
	got := <-w
	if got.err != nil {
		t.Fatal(got.err)
	}
	select {
	case rr := <-r:
		t.Fatalf("a reader got the lock while the writer holds it (%v)", rr.err)
	case <-time.After(50 * time.Millisecond):
	}
	got.h.Release()
	rr := <-r
	if rr.err != nil {
		t.Fatal(rr.err)
	}
	if rr.h.Token() <= got.h.Token() {
		t.Errorf("reader's token %d not above the writer's %d", rr.h.Token(), got.h.Token())
	}
	rr.h.Release()
}

// A writer that waits by notifications (its factory has no wait session)
// holds the intent key; a reader with a wait session does not queue past
// it: it waits until the writer has had the name.
func TestReaderGivesWayToNotifiedWriter(t *testing.T) {
	pool := newPool(t)
	name := uniq(t)
	ctx := ctxT(t)
	r0, err := newFactory(t, pool).Acquire(ctx, name, lock.WithShared())
	if err != nil {
		t.Fatal(err)
	}
	wf := newFactory(t, pool, pglock.WithWaitSessions(0), pglock.WithPollInterval(20*time.Millisecond))
	w := acquireAsync(ctx, wf, name)
	// The writer marks the name and takes the intent key.
	testenv.Eventually(t, 30*time.Second, "the intent key held", func() bool { return intentHolders(t, pool, name) > 0 })
	rf := newFactory(t, pool)
	if h, err := rf.Acquire(ctx, name, lock.WithShared()); !errors.Is(err, pglock.ErrLocked) {
		if err == nil {
			h.Release()
		}
		t.Fatalf("a reader that does not wait while a writer waits = %v; want ErrLocked", err)
	}
	r := acquireAsync(ctx, rf, name, lock.WithShared())
	select {
	case rr := <-r:
		t.Fatalf("a waiting reader got past a writer waiting by notifications (%v)", rr.err)
	case <-time.After(100 * time.Millisecond):
	}
	r0.Release()
	got := <-w
	if got.err != nil {
		t.Fatal(got.err)
	}
	select {
	case rr := <-r:
		t.Fatalf("a reader got the lock while the writer holds it (%v)", rr.err)
	case <-time.After(50 * time.Millisecond):
	}
	got.h.Release()
	rr := <-r
	if rr.err != nil {
		t.Fatal(rr.err)
	}
	if rr.h.Token() <= got.h.Token() {
		t.Errorf("reader's token %d not above the writer's %d", rr.h.Token(), got.h.Token())
	}
	rr.h.Release()
}

func intentHolders(t testing.TB, pool *pgxpool.Pool, name string) int {
	var n int
	if err := pool.QueryRow(ctxT(t), `SELECT count(*) FROM pg_locks l WHERE l.locktype = 'advisory' AND l.objsubid = 1
		AND l.granted AND (l.classid::int8 << 32) | l.objid::int8 = public.pglock_key('i', '', $1)`, name).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// A reader's check of the semaphore marker takes it for a moment only;
// when it finds it taken (shared_marker.sql), only a semaphore member,
// which holds it shared, turns the reader away with ErrLimitMismatch:
// another session holding it exclusive (another reader's check) does
// not. Both on the try and on the wait in Postgres's queue.
func TestSharedMarkerTaken(t *testing.T) {
	pool := newPool(t)
	ctx := ctxT(t)
	pc, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Release()
	c := pc.Conn()
	take := func(name, fn string) func() {
		t.Helper()
		var key int64
		if err := c.QueryRow(ctx, "SELECT public.pglock_key('g', '', $1)", name).Scan(&key); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Exec(ctx, "SELECT "+fn+"($1)", key); err != nil {
			t.Fatal(err)
		}
		unlock := "pg_advisory_unlock"
		if fn == "pg_advisory_lock_shared" {
			unlock = "pg_advisory_unlock_shared"
		}
		return func() {
			if _, err := c.Exec(ctx, "SELECT "+unlock+"($1)", key); err != nil {
				t.Fatal(err)
			}
		}
	}
	f, other := newFactory(t, pool), newFactory(t, pool)
	// acquire takes name shared; waiting, it first waits in Postgres's
	// queue behind a writer, and marker is taken while it waits.
	acquire := func(name string, wait bool, marker func() func(), opts ...pglock.Option) (*pglock.Holder, error) {
		opts = append(opts, lock.WithShared())
		if !wait {
			defer marker()()
			return f.Acquire(ctx, name, opts...)
		}
		x, err := other.Acquire(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		r := acquireAsync(ctx, f, name, opts...)
		untilQueued(t, pool, name, 1)
		defer marker()()
		x.Release()
		got := <-r
		return got.h, got.err
	}
	for _, wait := range []bool{false, true} {
		for _, row := range []bool{false, true} {
			var opts []pglock.Option
			if row {
				opts = append(opts, lock.WithOwner("me"))
			}
			name := uniq(t)
			// Held exclusive: not a semaphore.
			h, err := acquire(name, wait, func() func() { return take(name, "pg_advisory_lock") }, opts...)
			if err != nil {
				t.Fatalf("wait %v, row %v: a reader while the marker is held exclusive: %v", wait, row, err)
			}
			if h.Token() == 0 {
				t.Fatal("token 0")
			}
			h.Release()
			// Held shared: a semaphore member.
			h, err = acquire(name, wait, func() func() { return take(name, "pg_advisory_lock_shared") }, opts...)
			if err == nil {
				h.Release()
			}
			if !errors.Is(err, lock.ErrLimitMismatch) || errors.Is(err, lock.ErrLocked) {
				t.Fatalf("wait %v, row %v: a reader while the marker is held shared = %v; want ErrLimitMismatch", wait, row, err)
			}
			if n := advisoryOf(t, pool, name); n != 0 {
				t.Fatalf("wait %v, row %v: %d advisory locks of the name left after the refusal", wait, row, n)
			}
			h, err = f.Acquire(ctx, name, append(opts, lock.WithShared())...)
			if err != nil {
				t.Fatal(err)
			}
			h.Release()
		}
	}
}

// In a mix of readers and a writer that keep the name contended, each
// with a factory of its own, an acquisition costs the two statements of
// the raw locks, give or take: the wait in Postgres's queue (which is the
// try too: the name was contended lately) and the release.
func TestMixStatementsPerAcquisition(t *testing.T) {
	const readers, rounds = 5, 30
	name := uniq(t)
	var c counter
	fs := make([]*pglock.Factory, readers+1)
	for i := range fs {
		pool := newPool(t, func(cfg *pgxpool.Config) { cfg.ConnConfig.Tracer = &c })
		fs[i] = newFactory(t, pool, pglock.WithHealthInterval(time.Hour))
	}
	run := func(rounds int) {
		var wg sync.WaitGroup
		errs := make(chan error, len(fs))
		for i, f := range fs {
			opts := []pglock.Option{pglock.WithWait()}
			if i > 0 {
				opts = append(opts, lock.WithShared())
			}
			wg.Go(func() {
				for range rounds {
					h, err := f.Acquire(ctxT(t), name, opts...)
					if err != nil {
						errs <- err
						return
					}
					time.Sleep(200 * time.Microsecond)
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
	run(5) // opens the sessions
	c.n.Store(0)
	run(rounds)
	per := float64(c.n.Load()) / float64(len(fs)*rounds)
	t.Logf("%d readers and a writer: %.2f statements per acquisition", readers, per)
	if per > 2.5 {
		t.Fatalf("%.2f statements per acquisition; want at most 2.5", per)
	}
}
