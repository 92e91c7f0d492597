package pglock_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/ubgo/lock"
	"github.com/ubgo/lock/internal/testenv"
	"github.com/ubgo/lock/pglock"
)

// bouncerPool connects through the PgBouncer of scripts/services.sh to its
// database db: "session" (pool_mode=session) or "transaction"
// (pool_mode=transaction), both the test database.
func bouncerPool(t testing.TB, db string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), "postgres://postgres@"+testenv.PgBouncerAddr()+"/"+db+"?sslmode=disable")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	testenv.Need(t, "pgbouncer", pool.Ping)
	return pool
}

// advisoryKeysHeld returns how many advisory locks, granted or waited for,
// pg_locks on the real server shows of the keys of names (under no
// prefix): mutex, semaphore marker, waiters and the first permits.
func advisoryKeysHeld(t testing.TB, direct *pgxpool.Pool, names ...string) int {
	t.Helper()
	var n int
	err := direct.QueryRow(ctxT(t), `
		SELECT count(*) FROM pg_locks l WHERE l.locktype = 'advisory' AND l.objsubid = 1
		AND (l.classid::int8 << 32) | l.objid::int8 IN (
			SELECT public.pglock_key(k, '', n) FROM unnest($1::text[]) n, unnest(ARRAY['m', 'g', 'w']) k
			UNION ALL SELECT public.pglock_key('s', '', n, s) FROM unnest($1::text[]) n, generate_series(0, 3) s)`,
		names).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// setUpObjects makes sure pglock's objects exist (a factory creates them
// at its first Acquire, not at NewFactory), so pglock_key can be called
// on a server no test used yet.
func setUpObjects(t testing.TB, direct *pgxpool.Pool) {
	t.Helper()
	h, err := newFactory(t, direct).Acquire(ctxT(t), uniq(t)+"/setup")
	if err != nil {
		t.Fatal(err)
	}
	h.Release()
}

// Behind a transaction-mode pooler the first Acquire is refused with
// ErrSessionChanged, before anything is locked, and so is every later
// one; after Close the server holds nothing of the names.
func TestPgBouncerTransactionModeRefused(t *testing.T) {
	direct := newPool(t)
	pool := bouncerPool(t, "transaction")
	name, sem := uniq(t), uniq(t)+"/sem"
	setUpObjects(t, direct)
	f1, f2 := newFactory(t, pool), newFactory(t, pool)
	calls := []struct {
		f    *pglock.Factory
		name string
		opts []pglock.Option
	}{
		{f1, name, nil},
		{f2, name, nil},
		{f1, name, []pglock.Option{pglock.WithWait()}},
		{f2, sem, []pglock.Option{pglock.WithMaxConcurrent(3), pglock.WithWait()}},
		{f1, sem, []pglock.Option{pglock.WithMaxConcurrent(3)}},
	}
	for i, c := range calls {
		ctx, cancel := context.WithTimeout(ctxT(t), 10*time.Second)
		h, err := c.f.Acquire(ctx, c.name, c.opts...)
		cancel()
		if err == nil {
			h.Release()
			t.Fatalf("call %d: Acquire through a transaction pooler succeeded", i)
		}
		if !errors.Is(err, pglock.ErrSessionChanged) || errors.Is(err, lock.ErrLocked) {
			t.Fatalf("call %d: %v; want an error matching ErrSessionChanged and not ErrLocked", i, err)
		}
		if n := advisoryKeysHeld(t, direct, name, sem); n != 0 {
			t.Fatalf("call %d: the server holds %d advisory locks of the names after the refusal (%v)", i, n, err)
		}
	}
	f1.Close()
	f2.Close()
	if n := advisoryKeysHeld(t, direct, name, sem); n != 0 {
		t.Fatalf("the server holds %d advisory locks of the names after Close", n)
	}
}

// Eight factories whose first Acquires run at once, waiting, through one
// transaction-mode pool: the checks of one see the others' traffic, and
// still each is refused and nothing is left held (the issue saw locks
// stay held on PgBouncer's server connections after both factories
// closed).
func TestPgBouncerTransactionModeRefusedConcurrently(t *testing.T) {
	direct := newPool(t)
	pool := bouncerPool(t, "transaction")
	setUpObjects(t, direct)
	name := uniq(t)
	var refused atomic.Int32
	var wg sync.WaitGroup
	for range 8 {
		f := newFactory(t, pool)
		wg.Go(func() {
			defer f.Close()
			for range 5 {
				ctx, cancel := context.WithTimeout(ctxT(t), 10*time.Second)
				h, err := f.Acquire(ctx, name, pglock.WithWait())
				cancel()
				switch {
				case errors.Is(err, pglock.ErrSessionChanged):
					refused.Add(1)
				case err == nil:
					h.Release()
					t.Error("Acquire through a transaction pooler succeeded")
				default:
					t.Errorf("Acquire: %v; want an error matching ErrSessionChanged", err)
				}
			}
		})
	}
	wg.Wait()
	if refused.Load() != 40 {
		t.Fatalf("%d of 40 acquires refused", refused.Load())
	}
	if n := advisoryKeysHeld(t, direct, name); n != 0 {
		t.Fatalf("the server holds %d advisory locks of the name after Close", n)
	}
}

// Session pooling keeps a client on one server connection until it
// disconnects, which is all session locks need: the conformance suite
// passes through it.
func TestPgBouncerSessionModeConformance(t *testing.T) {
	runConformance(t, bouncerPool(t, "session"), newPool(t), true)
}

// Through session pooling, a factory's Close frees its locks on the server:
// the client connection ends and PgBouncer resets the server connection
// (server_reset_query, DISCARD ALL) before another client gets it.
func TestPgBouncerSessionModeCloseFrees(t *testing.T) {
	direct := newPool(t)
	pool := bouncerPool(t, "session")
	name := uniq(t)
	f := newFactory(t, pool)
	h, err := f.Acquire(ctxT(t), name)
	if err != nil {
		t.Fatal(err)
	}
	if pids := heldBy(t, direct, name); len(pids) != 1 || uint32(pids[0]) != h.BackendPID() {
		t.Fatalf("held by %v; want backend %d", pids, h.BackendPID())
	}
	f.Close()
	testenv.Eventually(t, 30*time.Second, "the lock freed on the server after Close", func() bool { return len(heldBy(t, direct, name)) == 0 })
	h2, err := newFactory(t, pool).Acquire(ctxT(t), name)
	if err != nil {
		t.Fatalf("Acquire after Close: %v", err)
	}
	h2.Release()
}

// Inspect and List run on pool connections, which for AcquireInTx's users
// reach the server through a transaction pooler: they prepare nothing
// (pgx's statement cache failed there with 42P05 and 26000 when several
// clients shared the server connections).
func TestPgBouncerTransactionModeInspect(t *testing.T) {
	pool := bouncerPool(t, "transaction")
	name := uniq(t)
	tx := begin(t, pool)
	h, err := newFactory(t, pool).AcquireInTx(ctxT(t), tx, name)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 8 {
		f := newFactory(t, pool)
		wg.Go(func() {
			for range 20 {
				info, err := f.Inspect(ctxT(t), name)
				if err != nil {
					t.Error(err)
					return
				}
				if len(info.Holders) != 1 || info.Holders[0].Metadata["pg.pid"] != strconv.Itoa(int(h.BackendPID())) {
					t.Errorf("Inspect: %+v; want the transaction's backend %d", info, h.BackendPID())
					return
				}
				for _, err := range f.List(ctxT(t), name) {
					if err != nil {
						t.Error(err)
						return
					}
				}
			}
		})
	}
	wg.Wait()
}
