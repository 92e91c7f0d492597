package pglock_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/ubgo/lock"
	"github.com/ubgo/lock/internal/testenv"
	"github.com/ubgo/lock/locktest"
	"github.com/ubgo/lock/pglock"
)

// storeSchema creates an empty schema for one test, dropped at its end, so
// that the stores create their tables on first use.
func storeSchema(t testing.TB, pool *pgxpool.Pool) string {
	t.Helper()
	schema := fmt.Sprintf("fence_test_%x", time.Now().UnixNano())
	if _, err := pool.Exec(context.Background(), "CREATE SCHEMA "+schema); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pool.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE") })
	return schema
}

// Each constructor call gets a pool of its own, as another process would,
// on a schema whose tables do not exist yet.
func TestFenceConformance(t *testing.T) {
	schema := storeSchema(t, newPool(t))
	locktest.RunFence(t, func(t testing.TB) lock.Fence {
		return pglock.NewFence(newPool(t), pglock.WithSchema(schema))
	})
}

func TestLedgerConformance(t *testing.T) {
	schema := storeSchema(t, newPool(t))
	locktest.RunLedger(t, func(t testing.TB) lock.Ledger {
		return pglock.NewLedger(newPool(t), pglock.WithSchema(schema))
	})
}

// Many stores in several pools use a fresh schema at once: every one of
// them creates or finds the tables, and none fails.
func TestStoreTablesCreatedConcurrently(t *testing.T) {
	admin := newPool(t)
	schema := storeSchema(t, admin)
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for i := range 8 {
		pool := newPool(t)
		wg.Add(2)
		go func() {
			defer wg.Done()
			errs <- pglock.NewFence(pool, pglock.WithSchema(schema)).RejectIfStale(ctxT(t), fmt.Sprint("k", i), 1)
		}()
		go func() {
			defer wg.Done()
			errs <- pglock.NewLedger(pool, pglock.WithSchema(schema)).MarkDone(ctxT(t), fmt.Sprint("k", i), 1)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	// A table dropped while in use is created again.
	f := pglock.NewFence(admin, pglock.WithSchema(schema))
	if err := f.RejectIfStale(ctxT(t), "k", 5); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctxT(t), "DROP TABLE "+schema+".pglock_fences"); err != nil {
		t.Fatal(err)
	}
	if err := f.RejectIfStale(ctxT(t), "k", 5); err != nil {
		t.Fatalf("after DROP TABLE: %v", err)
	}
}

// The rows an operator sees, the prefix as a namespace, and the re-run.
func TestStoreRows(t *testing.T) {
	pool := newPool(t)
	schema := storeSchema(t, pool)
	ctx := ctxT(t)
	f := pglock.NewFence(pool, pglock.WithSchema(schema), pglock.WithKeyPrefix("app1"))
	other := pglock.NewFence(pool, pglock.WithSchema(schema), pglock.WithKeyPrefix("app2"))
	l := pglock.NewLedger(pool, pglock.WithSchema(schema), pglock.WithKeyPrefix("app1"))
	if err := f.RejectIfStale(ctx, "export", 1<<63+5); err != nil {
		t.Fatal(err)
	}
	if err := other.RejectIfStale(ctx, "export", 1); err != nil {
		t.Fatalf("another prefix shares the fence: %v", err)
	}
	if err := l.MarkDone(ctx, "backup", 1<<64-1); err != nil {
		t.Fatal(err)
	}
	var tok string
	if err := pool.QueryRow(ctx, "SELECT token::text FROM "+schema+".pglock_fences WHERE ns = 'app1' AND key = 'export'").Scan(&tok); err != nil || tok != "9223372036854775813" {
		t.Fatalf("fence row: %q %v", tok, err)
	}
	if err := pool.QueryRow(ctx, "SELECT token::text FROM "+schema+".pglock_ledger WHERE ns = 'app1' AND key = 'backup'").Scan(&tok); err != nil || tok != "18446744073709551615" {
		t.Fatalf("ledger row: %q %v", tok, err)
	}
	if _, err := pool.Exec(ctx, "DELETE FROM "+schema+".pglock_ledger WHERE ns = 'app1' AND key = 'backup'"); err != nil {
		t.Fatal(err)
	}
	if done, err := l.IsDone(ctx, "backup"); done || err != nil {
		t.Fatalf("after DELETE: done %v err %v", done, err)
	}
	// The SQL for administrators creates the same tables.
	schema2 := storeSchema(t, pool)
	if _, err := pool.Exec(ctx, pglock.StoreSetupSQL(schema2)); err != nil {
		t.Fatal(err)
	}
	if err := pglock.NewFence(pool, pglock.WithSchema(schema2)).RejectIfStale(ctx, "k", 1); err != nil {
		t.Fatal(err)
	}
}

// RejectIfStaleTx joins the write's transaction: a stale check leaves the
// transaction to be rolled back with its writes; a writer with a lower
// token waits for the transaction that holds the fence row and then sees
// its committed token; a rolled-back token is not recorded.
func TestFenceTx(t *testing.T) {
	pool := newPool(t)
	schema := storeSchema(t, pool)
	ctx := ctxT(t)
	f := pglock.NewFence(pool, pglock.WithSchema(schema))
	if _, err := pool.Exec(ctx, "CREATE TABLE "+schema+".exports (id int PRIMARY KEY, data text)"); err != nil {
		t.Fatal(err)
	}
	write := func(token uint64, data string) error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if err := f.RejectIfStaleTx(ctx, tx, "exports", token); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "INSERT INTO "+schema+".exports VALUES (1, $1) ON CONFLICT (id) DO UPDATE SET data = EXCLUDED.data", data)
			return err
		})
	}
	data := func() string {
		var d string
		pool.QueryRow(ctx, "SELECT data FROM "+schema+".exports WHERE id = 1").Scan(&d)
		return d
	}
	if err := write(5, "five"); err != nil {
		t.Fatal(err)
	}
	if err := write(4, "four"); !errors.Is(err, lock.ErrStaleToken) || data() != "five" {
		t.Fatalf("stale write: %v, data %q", err, data())
	}

	// Token 10 holds the row, uncommitted; token 9 waits for it.
	txA, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer txA.Rollback(ctx)
	if err := f.RejectIfStaleTx(ctx, txA, "exports", 10); err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() { got <- write(9, "nine") }()
	waitBlocked(t, pool, "pglock_fences")
	if err := txA.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; !errors.Is(err, lock.ErrStaleToken) {
		t.Fatalf("token 9 after 10 committed: %v", err)
	}

	// A rolled-back token 20 is not recorded.
	txB, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.RejectIfStaleTx(ctx, txB, "exports", 20); err != nil {
		t.Fatal(err)
	}
	txB.Rollback(ctx)
	if err := write(11, "eleven"); err != nil || data() != "eleven" {
		t.Fatalf("token 11 after 20 rolled back: %v, data %q", err, data())
	}
	if err := f.RejectIfStaleTx(ctx, nil, "exports", 12); !errors.Is(err, lock.ErrInvalidOption) {
		t.Fatalf("nil tx: %v", err)
	}
}

// waitBlocked waits until a backend waits for a lock in a statement on table.
func waitBlocked(t testing.TB, pool *pgxpool.Pool, table string) {
	t.Helper()
	testenv.Eventually(t, 30*time.Second, "the second writer waiting for the fence row", func() bool {
		var n int
		err := pool.QueryRow(ctxT(t), `SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND query LIKE '%'||$1||'%' AND pid <> pg_backend_pid()`, table).Scan(&n)
		if err != nil {
			t.Fatal(err)
		}
		return n > 0
	})
}

// A role that may not create the tables gets an error that says what to
// do; once an administrator ran StoreSetupSQL and granted the rights, it
// works, and a role without rights on the table is told so.
func TestStorePermissions(t *testing.T) {
	admin := newPool(t)
	schema := storeSchema(t, admin)
	ctx := ctxT(t)
	role := fmt.Sprintf("fence_test_role_%x", time.Now().UnixNano())
	if _, err := admin.Exec(ctx, "CREATE ROLE "+role+" LOGIN"); err != nil {
		t.Skipf("cannot create a role to test with: %v", err)
	}
	t.Cleanup(func() {
		admin.Exec(context.Background(), "DROP OWNED BY "+role)
		admin.Exec(context.Background(), "DROP ROLE "+role)
	})
	if _, err := admin.Exec(ctx, "GRANT USAGE ON SCHEMA "+schema+" TO "+role); err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(testenv.PostgresDSN())
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(role)
	cfg, err := pgxpool.ParseConfig(u.String())
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err == nil {
		err = pool.Ping(ctx)
	}
	if err != nil {
		t.Skipf("cannot log in as %s (the server's authentication rules): %v", role, err)
	}
	defer pool.Close()

	f := pglock.NewFence(pool, pglock.WithSchema(schema))
	err = f.RejectIfStale(ctx, "k", 1)
	if err == nil || !strings.Contains(err.Error(), "StoreSetupSQL") || errors.Is(err, lock.ErrStaleToken) {
		t.Fatalf("without CREATE: %v; want an error naming StoreSetupSQL", err)
	}
	if _, err := admin.Exec(ctx, pglock.StoreSetupSQL(schema)); err != nil {
		t.Fatal(err)
	}
	if err := f.RejectIfStale(ctx, "k", 1); err == nil || !strings.Contains(err.Error(), "grant") {
		t.Fatalf("without rights on the table: %v; want an error saying what to grant", err)
	}
	if _, err := admin.Exec(ctx, "GRANT SELECT, INSERT, UPDATE ON "+schema+".pglock_fences, "+schema+".pglock_ledger TO "+role); err != nil {
		t.Fatal(err)
	}
	if err := f.RejectIfStale(ctx, "k", 1); err != nil {
		t.Fatal(err)
	}
	l := pglock.NewLedger(pool, pglock.WithSchema(schema))
	if err := l.MarkDone(ctx, "k", 1); err != nil {
		t.Fatal(err)
	}
}

func TestStoreBadInput(t *testing.T) {
	ctx := context.Background()
	if err := pglock.NewFence(nil).RejectIfStale(ctx, "k", 1); !errors.Is(err, lock.ErrInvalidOption) {
		t.Errorf("nil pool: %v", err)
	}
	if err := pglock.NewFence(newPool(t), pglock.WithSchema("")).RejectIfStale(ctx, "k", 1); !errors.Is(err, lock.ErrInvalidOption) {
		t.Errorf("empty schema: %v", err)
	}
	if err := pglock.NewFence(newPool(t), pglock.WithKeyPrefix("a\x00")).RejectIfStale(ctx, "k", 1); !errors.Is(err, lock.ErrInvalidOption) {
		t.Errorf("NUL in prefix: %v", err)
	}
	if done, err := pglock.NewLedger(nil).IsDone(ctx, "k"); done || !errors.Is(err, lock.ErrInvalidOption) {
		t.Errorf("nil pool Done: %v %v", done, err)
	}
	closed := newPool(t)
	closed.Close()
	if err := pglock.NewLedger(closed).MarkDone(ctx, "k", 1); err == nil {
		t.Errorf("closed pool: MarkDone reported success")
	}
}

// Replicas of lock.RunOnce, each with its own pool, factory and ledger.
func TestRunOnceLateReplica(t *testing.T) {
	schema := storeSchema(t, newPool(t))
	locktest.RunOnceReplicas(t, func(t testing.TB, opts ...lock.Option) lock.Locker {
		f := pglock.NewFactory(newPool(t), pglock.WithLogger(nil))
		t.Cleanup(func() { f.Close() })
		return f.AsLocker(opts...)
	}, func(t testing.TB) lock.Ledger { return pglock.NewLedger(newPool(t), pglock.WithSchema(schema)) })
}

// Holder A's session ends behind its back (a partition, a terminated
// backend) while A is paused and cannot notice; B acquires with a larger
// token and writes through the fence, and A's late write with its old token
// is refused.
func TestFenceStaleWriter(t *testing.T) {
	admin := newPool(t)
	schema := storeSchema(t, admin)
	ctx := ctxT(t)
	name := fmt.Sprintf("export/%x", time.Now().UnixNano())
	poolA, poolB := newPool(t), newPool(t)
	fa := pglock.NewFactory(poolA, pglock.WithLogger(nil), pglock.WithHealthInterval(time.Hour))
	defer fa.Close()
	fb := pglock.NewFactory(poolB, pglock.WithLogger(nil))
	defer fb.Close()
	a, err := fa.Acquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	locktest.RunStaleWriter(t, ctx, locktest.StaleWriter{Name: name, A: a,
		FenceA: pglock.NewFence(poolA, pglock.WithSchema(schema)),
		FenceB: pglock.NewFence(poolB, pglock.WithSchema(schema)),
		TakeOver: func() (lock.Holder, error) {
			var ok bool
			if err := admin.QueryRow(ctx, "SELECT pg_terminate_backend($1)", int32(a.BackendPID())).Scan(&ok); err != nil || !ok {
				t.Fatalf("pg_terminate_backend: %v %v", ok, err)
			}
			return fb.Acquire(ctx, name, pglock.WithWait())
		}})
}

// The fence check joins the transaction of the guarded write: both commit,
// or neither.
func ExampleFence_RejectIfStaleTx() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://app@db/app")
	if err != nil {
		return
	}
	defer pool.Close()
	locks := pglock.NewFactory(pool)
	defer locks.Close()
	fence := pglock.NewFence(pool)

	h, err := locks.Acquire(ctx, "exports/today")
	if err != nil {
		return
	}
	defer h.Release()
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := fence.RejectIfStaleTx(ctx, tx, "exports/today", h.Token()); err != nil {
			return err // lock.ErrStaleToken: a newer holder has written
		}
		_, err := tx.Exec(ctx, `UPDATE exports SET data = $1 WHERE id = 'today'`, "…")
		return err
	})
	if errors.Is(err, lock.ErrStaleToken) {
		return // dropped: ours was the stale write
	}
}
