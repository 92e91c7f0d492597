package pglock_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
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

func uniq(t testing.TB) string { return fmt.Sprintf("%s/%x", t.Name(), time.Now().UnixNano()) }

func newFactory(t testing.TB, pool *pgxpool.Pool, opts ...pglock.Option) *pglock.Factory {
	f := pglock.NewFactory(pool, append([]pglock.Option{pglock.WithLogger(nil)}, opts...)...)
	t.Cleanup(func() { f.Close() })
	return f
}

// heldBy returns the pids that hold the mutex of name, found the way the
// guide tells operators to: pg_locks and the pglock_key function.
func heldBy(t testing.TB, pool *pgxpool.Pool, name string) []int32 {
	t.Helper()
	// The first query of the guide's "Seeing and clearing locks".
	rows, err := pool.Query(ctxT(t), `
		SELECT l.pid, a.application_name, a.client_addr, a.backend_start
		FROM pg_locks l JOIN pg_stat_activity a USING (pid)
		WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted
		  AND (l.classid::int8 << 32) | l.objid::int8 = public.pglock_key('m', '', $1)`, name)
	if err != nil {
		t.Fatal(err)
	}
	var pids []int32
	for rows.Next() {
		var pid int32
		if err := rows.Scan(&pid, nil, nil, nil); err != nil {
			t.Fatal(err)
		}
		pids = append(pids, pid)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return pids
}

// Scenario 2: three replicas race for the hourly tick; one runs it.
func TestScenarioCronSingleton(t *testing.T) {
	pool := newPool(t)
	name := uniq(t)
	var ran, skipped atomic.Int32
	release := make(chan struct{})
	var wg sync.WaitGroup
	for i := 0; i < 3; i++ {
		f := newFactory(t, pool)
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := f.WithLock(ctxT(t), name, func(ctx context.Context) error {
				ran.Add(1)
				<-release
				return nil
			})
			if errors.Is(err, pglock.ErrLocked) {
				if skipped.Add(1) == 2 {
					close(release)
				}
				return
			}
			if err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if ran.Load() != 1 || skipped.Load() != 2 {
		t.Fatalf("ran %d, skipped %d; want 1 and 2", ran.Load(), skipped.Load())
	}
}

func TestDocumentedPgLocksQueryFindsTheLock(t *testing.T) {
	pool := newPool(t)
	f := newFactory(t, pool)
	name := uniq(t) + "/ünï cødé"
	// With an owner, each holder has a row in pglock_holders.
	h, err := f.Acquire(ctxT(t), name, pglock.WithOwner("docs"))
	if err != nil {
		t.Fatal(err)
	}
	pids := heldBy(t, pool, name)
	if len(pids) != 1 || uint32(pids[0]) != h.BackendPID() {
		t.Fatalf("pg_locks shows %v holding %q; want [%d]", pids, name, h.BackendPID())
	}
	// The semaphore slot keys too.
	s, err := f.Acquire(ctxT(t), name+"/sem", pglock.WithMaxConcurrent(2), pglock.WithOwner("docs"))
	if err != nil {
		t.Fatal(err)
	}
	var n int
	err = pool.QueryRow(ctxT(t), `SELECT count(*) FROM pg_locks l
		WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted AND l.pid = $2
		  AND (l.classid::int8 << 32) | l.objid::int8 IN (public.pglock_key('s', '', $1, 0), public.pglock_key('s', '', $1, 1))`,
		name+"/sem", int32(s.BackendPID())).Scan(&n)
	if err != nil || n != 1 {
		t.Fatalf("slot keys of the semaphore held: %d, %v; want 1", n, err)
	}
	// The guide's semaphore and published-holder queries.
	var slot, pid int32
	err = pool.QueryRow(ctxT(t), `SELECT s.slot, l.pid
		FROM generate_series(0, 1) AS s(slot)
		JOIN pg_locks l ON l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted
		  AND (l.classid::int8 << 32) | l.objid::int8 = public.pglock_key('s', '', $1, s.slot)`, name+"/sem").Scan(&slot, &pid)
	if err != nil || uint32(pid) != s.BackendPID() {
		t.Fatalf("semaphore query: slot %d pid %d, %v", slot, pid, err)
	}
	// The rows are written by the acquire statements: there once Acquire
	// returned.
	rows, err := pool.Query(ctxT(t), `SELECT h.ns, h.name, h.slot, h.token, h.since, h.owner, h.pid, a.application_name
		FROM public.pglock_holders h
		JOIN pg_locks l ON l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted
		  AND l.pid = h.pid AND (l.classid::int8 << 32) | l.objid::int8 = h.key
		JOIN pg_stat_activity a ON a.pid = h.pid`)
	if err != nil {
		t.Fatal(err)
	}
	found := 0
	for rows.Next() {
		var ns, n, owner, app string
		var slot, pid int32
		var token int64
		var since time.Time
		if err := rows.Scan(&ns, &n, &slot, &token, &since, &owner, &pid, &app); err != nil {
			t.Fatal(err)
		}
		if owner == "docs" && ((n == name && uint64(token) == h.Token()) || (n == name+"/sem" && uint64(token) == s.Token())) {
			found++
		}
	}
	if err := rows.Err(); err != nil || found != 2 {
		t.Fatalf("published holders found: %d, %v; want 2", found, err)
	}
	h.Release()
	s.Release()
	if pids := heldBy(t, pool, name); len(pids) != 0 {
		t.Fatalf("after Release pg_locks still shows %v", pids)
	}
	// Each release deleted its row.
	var left int
	if err := pool.QueryRow(ctxT(t), `SELECT count(*) FROM public.pglock_holders WHERE name IN ($1, $2)`, name, name+"/sem").Scan(&left); err != nil || left != 0 {
		t.Fatalf("rows left after Release: %d, %v", left, err)
	}
}

func TestInProcessTableStopsReentrancy(t *testing.T) {
	pool := newPool(t)
	f := newFactory(t, pool, pglock.WithSessions(1))
	name := uniq(t)
	h, err := f.Acquire(ctxT(t), name)
	if err != nil {
		t.Fatal(err)
	}
	// Same factory, same session: Postgres would grant it again.
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if h2, err := f.Acquire(ctxT(t), name); !errors.Is(err, pglock.ErrLocked) {
				if h2 != nil {
					h2.Release()
				}
				t.Errorf("second local Acquire = %v; want ErrLocked", err)
			}
		}()
	}
	wg.Wait()
	h.Release()

	// A semaphore's permits on one session are distinct slots.
	var hs []*pglock.Holder
	for i := 0; i < 3; i++ {
		h, err := f.Acquire(ctxT(t), name+"/sem", pglock.WithMaxConcurrent(3))
		if err != nil {
			t.Fatal(err)
		}
		hs = append(hs, h)
	}
	if _, err := f.Acquire(ctxT(t), name+"/sem", pglock.WithMaxConcurrent(3)); !errors.Is(err, pglock.ErrLocked) {
		t.Fatalf("fourth permit: %v", err)
	}
	info, err := f.Inspect(ctxT(t), name+"/sem")
	if err != nil || len(info.Holders) != 3 || info.Limit != 3 {
		t.Fatalf("Inspect = %+v, %v; want 3 holders of limit 3", info, err)
	}
	for _, h := range hs {
		if err := h.Release(); err != nil {
			t.Fatal(err)
		}
	}
}

func TestTokensIncreaseAcrossFactoriesAndSemaphores(t *testing.T) {
	pool := newPool(t)
	name := uniq(t)
	var last uint64
	for i := 0; i < 6; i++ {
		f := newFactory(t, pool)
		h, err := f.Acquire(ctxT(t), name)
		if err != nil {
			t.Fatal(err)
		}
		if h.Token() <= last {
			t.Fatalf("token %d after %d", h.Token(), last)
		}
		last = h.Token()
		h.Release()
		f.Close()
	}
	f := newFactory(t, pool)
	seen := map[uint64]bool{}
	var hs []*pglock.Holder
	for i := 0; i < 4; i++ {
		h, err := f.Acquire(ctxT(t), name+"/sem", pglock.WithMaxConcurrent(4))
		if err != nil {
			t.Fatal(err)
		}
		if seen[h.Token()] || h.Token() <= last {
			t.Fatalf("permit token %d reused or not above %d", h.Token(), last)
		}
		seen[h.Token()] = true
		hs = append(hs, h)
	}
	for _, h := range hs {
		h.Release()
	}
}

func TestLimits(t *testing.T) {
	pool := newPool(t)
	a, b := newFactory(t, pool), newFactory(t, pool)
	name := uniq(t)
	ctx := ctxT(t)
	// A mutex and a semaphore of one name exclude each other with a
	// limit mismatch, in both orders and across processes.
	m, err := a.Acquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Acquire(ctx, name, pglock.WithMaxConcurrent(2)); !errors.Is(err, lock.ErrLimitMismatch) {
		t.Fatalf("semaphore while a mutex is held: %v", err)
	}
	m.Release()
	s, err := b.Acquire(ctx, name, pglock.WithMaxConcurrent(2))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Acquire(ctx, name); !errors.Is(err, lock.ErrLimitMismatch) {
		t.Fatalf("mutex while a semaphore is held: %v", err)
	}
	if _, err := a.Acquire(ctx, name, pglock.WithMaxConcurrent(3)); !errors.Is(err, lock.ErrLimitMismatch) {
		t.Fatalf("limit 3 while limit 2 is held: %v", err)
	}
	s.Release()
	// Once the name is free its limit may change.
	s3, err := a.Acquire(ctx, name, pglock.WithMaxConcurrent(3))
	if err != nil {
		t.Fatalf("limit 3 on a free name: %v", err)
	}
	s3.Release()
	var lim int
	if err := pool.QueryRow(ctx, `SELECT lim FROM public.pglock_limits WHERE name = $1`, name).Scan(&lim); err != nil || lim != 3 {
		t.Fatalf("stored limit %d, %v; want 3", lim, err)
	}
}

func TestWaitIsWokenByRelease(t *testing.T) {
	pool := newPool(t)
	// The fallback poll is far away: only the release notification can
	// wake the waiter in time.
	a := newFactory(t, pool)
	b := newFactory(t, pool, pglock.WithPollInterval(time.Hour))
	for _, limit := range []int{1, 2} {
		name := uniq(t)
		var hs []*pglock.Holder
		for i := 0; i < limit; i++ {
			h, err := a.Acquire(ctxT(t), name, pglock.WithMaxConcurrent(limit))
			if err != nil {
				t.Fatal(err)
			}
			hs = append(hs, h)
		}
		got := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			h, err := b.Acquire(ctx, name, pglock.WithWait(), pglock.WithMaxConcurrent(limit))
			if err == nil {
				err = h.Release()
			}
			got <- err
		}()
		waitForWaiter(t, pool, name)
		if err := hs[0].Release(); err != nil {
			t.Fatal(err)
		}
		if err := <-got; err != nil {
			t.Fatalf("limit %d: waiter: %v", limit, err)
		}
		for _, h := range hs[1:] {
			h.Release()
		}
	}
}

// waiterPIDs is the SQL of the backends that wait for name ($1): blocked
// in Postgres's queue of its mutex key, or marking it as waited for.
const waiterPIDs = `SELECT l.pid FROM pg_locks l WHERE l.locktype = 'advisory' AND l.objsubid = 1
	AND ((l.mode = 'ShareLock' AND (l.classid::int8 << 32) | l.objid::int8 = public.pglock_key('w', '', $1))
		OR (NOT l.granted AND (l.classid::int8 << 32) | l.objid::int8 = public.pglock_key('m', '', $1)))`

// waitForWaiter returns once some session waits for name: blocked in
// Postgres, or marked and about to retry once.
func waitForWaiter(t testing.TB, pool *pgxpool.Pool, name string) {
	t.Helper()
	testenv.Eventually(t, 30*time.Second, "a waiter registered", func() bool { return waiters(t, pool, name) > 0 })
}

func TestInspectReportsSession(t *testing.T) {
	pool := newPool(t)
	app := "pglock-inspect-" + fmt.Sprint(time.Now().UnixNano()%1e6)
	f := newFactory(t, pool, pglock.WithApplicationName(app))
	other := newFactory(t, pool)
	name := uniq(t)
	before := time.Now()
	h, err := f.Acquire(ctxT(t), name, pglock.WithOwner("job-42"), pglock.WithMetadata("tenant", "acme"))
	if err != nil {
		t.Fatal(err)
	}
	info, err := other.Inspect(ctxT(t), name)
	if err != nil {
		t.Fatal(err)
	}
	if info.Limit != 1 || len(info.Holders) != 1 {
		t.Fatalf("Inspect = %+v", info)
	}
	hi := info.Holders[0]
	if hi.Token != h.Token() || hi.Owner != "job-42" || hi.Metadata["tenant"] != "acme" ||
		hi.Metadata["pg.pid"] != fmt.Sprint(h.BackendPID()) || hi.Metadata["pg.application_name"] != app ||
		hi.Since.Before(before.Add(-time.Second)) || !hi.Expires.IsZero() {
		t.Fatalf("holder = %+v; want token %d, owner job-42, pid %d, app %s", hi, h.Token(), h.BackendPID(), app)
	}
	h.Release()
	if info, err := other.Inspect(ctxT(t), name); err != nil || len(info.Holders) != 0 {
		t.Fatalf("Inspect after release = %+v, %v", info, err)
	}

	// A holder without owner or metadata has no row: Inspect shows its
	// session, without a token.
	h, err = f.Acquire(ctxT(t), name)
	if err != nil {
		t.Fatal(err)
	}
	info, err = other.Inspect(ctxT(t), name)
	if err != nil || info.Limit != 1 || len(info.Holders) != 1 {
		t.Fatalf("Inspect of a plain holder = %+v, %v", info, err)
	}
	if hi := info.Holders[0]; hi.Token != 0 || hi.Owner != "" || !hi.Since.IsZero() ||
		hi.Metadata["pg.pid"] != fmt.Sprint(h.BackendPID()) || hi.ID != fmt.Sprintf("pid %d (%s)", h.BackendPID(), app) {
		t.Fatalf("plain holder = %+v; want pid %d and no token", hi, h.BackendPID())
	}
	h.Release()

	// Semaphore permits: their slots, and the row of the one that has one.
	sem := name + "/sem"
	plain, err := f.Acquire(ctxT(t), sem, pglock.WithMaxConcurrent(3))
	if err != nil {
		t.Fatal(err)
	}
	owned, err := f.Acquire(ctxT(t), sem, pglock.WithMaxConcurrent(3), pglock.WithOwner("job-43"))
	if err != nil {
		t.Fatal(err)
	}
	info, err = other.Inspect(ctxT(t), sem)
	if err != nil || info.Limit != 3 || len(info.Holders) != 2 {
		t.Fatalf("Inspect of a semaphore = %+v, %v", info, err)
	}
	// Sorted by token: the plain permit (0) first.
	if a, b := info.Holders[0], info.Holders[1]; a.Token != 0 || a.Metadata["pg.slot"] != "0" ||
		b.Token != owned.Token() || b.Owner != "job-43" || b.Metadata["pg.slot"] != "1" {
		t.Fatalf("semaphore holders = %+v", info.Holders)
	}
	plain.Release()
	owned.Release()
	if info, err := other.Inspect(ctxT(t), sem); err != nil || len(info.Holders) != 0 {
		t.Fatalf("Inspect after release = %+v, %v", info, err)
	}
}

func TestBadInput(t *testing.T) {
	pool := newPool(t)
	quiet := pglock.WithLogger(nil)
	for _, tc := range []struct {
		what string
		f    *pglock.Factory
		opts []pglock.Option
	}{
		{"nil pool", pglock.NewFactory(nil, quiet), nil},
		{"WithSessions(0)", pglock.NewFactory(pool, quiet, pglock.WithSessions(0)), nil},
		{"WithSchema(\"\")", pglock.NewFactory(pool, quiet, pglock.WithSchema("")), nil},
		{"WithHealthInterval(0)", pglock.NewFactory(pool, quiet, pglock.WithHealthInterval(0)), nil},
		{"WithConnectTimeout(-1)", pglock.NewFactory(pool, quiet, pglock.WithConnectTimeout(-1)), nil},
		{"prefix with NUL", pglock.NewFactory(pool, quiet), []pglock.Option{pglock.WithKeyPrefix("a\x00b")}},
		{"too many permits", pglock.NewFactory(pool, quiet), []pglock.Option{pglock.WithMaxConcurrent(pglock.MaxPermits + 1)}},
	} {
		h, err := tc.f.Acquire(ctxT(t), "x", tc.opts...)
		if err == nil {
			h.Release()
			t.Errorf("%s: Acquire succeeded", tc.what)
		} else if !errors.Is(err, lock.ErrInvalidOption) {
			t.Errorf("%s: %v; want ErrInvalidOption", tc.what, err)
		}
		tc.f.Close()
	}
}

// Objects are created on first use, by racing factories at once, in a
// schema of their own.
func TestSetupRacesAndSchema(t *testing.T) {
	pool := newPool(t)
	schema := fmt.Sprintf("pglock_race_%d", time.Now().UnixNano()%1e9)
	if _, err := pool.Exec(ctxT(t), "CREATE SCHEMA "+schema); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pool.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE") })
	var wg sync.WaitGroup
	for i := 0; i < 6; i++ {
		f := newFactory(t, pool, pglock.WithSchema(schema))
		wg.Add(1)
		go func() {
			defer wg.Done()
			h, err := f.Acquire(ctxT(t), fmt.Sprint("setup-", i), pglock.WithMaxConcurrent(2))
			if err != nil {
				t.Error(err)
				return
			}
			h.Release()
		}()
	}
	wg.Wait()
}

func TestMissingRightsGiveAClearError(t *testing.T) {
	admin := newPool(t)
	ctx := ctxT(t)
	role := "pglock_test_noperm"
	schema := fmt.Sprintf("pglock_noperm_%d", time.Now().UnixNano()%1e9)
	for _, q := range []string{
		"DO $$ BEGIN CREATE ROLE " + role + " LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$",
		"CREATE SCHEMA " + schema,
		"GRANT USAGE ON SCHEMA " + schema + " TO " + role,
	} {
		if _, err := admin.Exec(ctx, q); err != nil {
			t.Skipf("cannot prepare a role without rights: %v", err)
		}
	}
	t.Cleanup(func() { admin.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE") })
	pool := newPool(t, func(c *pgxpool.Config) { c.ConnConfig.User = role })
	f := newFactory(t, pool, pglock.WithSchema(schema))
	_, err := f.Acquire(ctx, "x")
	if err == nil || !strings.Contains(err.Error(), "SetupSQL") || !strings.Contains(err.Error(), "permission denied") {
		t.Fatalf("Acquire without rights: %v; want a clear error naming SetupSQL", err)
	}
	// Created by an administrator, the objects work for the role.
	if _, err := admin.Exec(ctx, pglock.SetupSQL(schema)); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA " + schema + " TO " + role,
		"GRANT USAGE, UPDATE ON ALL SEQUENCES IN SCHEMA " + schema + " TO " + role,
	} {
		if _, err := admin.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	f2 := newFactory(t, pool, pglock.WithSchema(schema))
	h, err := f2.Acquire(ctx, "x", pglock.WithMaxConcurrent(2))
	if err != nil {
		t.Fatalf("Acquire with objects created by an administrator: %v", err)
	}
	h.Release()
}

// A waiter whose session ends waits again on the next one, so the release
// still wakes it (the fallback poll is an hour away): blocked on a wait
// session, and with WithWaitSessions(0) marking the name on its lock
// session.
func TestWaiterSurvivesSessionLoss(t *testing.T) {
	pool := newPool(t)
	a := newFactory(t, pool)
	for _, ws := range []int{pglock.DefaultWaitSessions, 0} {
		b := newFactory(t, pool, pglock.WithPollInterval(time.Hour), pglock.WithHealthInterval(100*time.Millisecond), pglock.WithWaitSessions(ws))
		name := uniq(t)
		h, err := a.Acquire(ctxT(t), name)
		if err != nil {
			t.Fatal(err)
		}
		got := make(chan error, 1)
		go func() {
			w, err := b.Acquire(ctxT(t), name, pglock.WithWait())
			if err == nil {
				err = w.Release()
			}
			got <- err
		}()
		waitForWaiter(t, pool, name)
		var pid int32
		if err := pool.QueryRow(ctxT(t), waiterPIDs, name).Scan(&pid); err != nil {
			t.Fatal(err)
		}
		terminate(t, pool, uint32(pid))
		testenv.Eventually(t, 20*time.Second, "waiter waiting on a new session", func() bool {
			var n int
			pool.QueryRow(ctxT(t), `SELECT count(*) FROM (`+waiterPIDs+`) w WHERE pid <> $2`, name, pid).Scan(&n)
			return n > 0
		})
		h.Release()
		select {
		case err := <-got:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("wait sessions %d: waiter not woken by the release after its session was replaced", ws)
		}
	}
}

// A crash resets the unlogged token counter to its start; the next acquire
// moves to a new epoch instead of handing out a token again. The reset is
// done here by hand, exactly as crash recovery leaves the sequence.
func TestTokensSurviveCounterReset(t *testing.T) {
	pool := newPool(t)
	schema := fmt.Sprintf("pglock_reset_%d", time.Now().UnixNano()%1e9)
	if _, err := pool.Exec(ctxT(t), "CREATE SCHEMA "+schema); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pool.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE") })
	f := newFactory(t, pool, pglock.WithSchema(schema))
	name := uniq(t)
	var last uint64
	take := func(opts ...pglock.Option) {
		t.Helper()
		// With an owner, the holder's row gets the new token too.
		h, err := f.Acquire(ctxT(t), name, append(opts, pglock.WithOwner("reset"))...)
		if err != nil {
			t.Fatal(err)
		}
		if h.Token() <= last {
			t.Fatalf("token %d after %d", h.Token(), last)
		}
		last = h.Token()
		info, err := f.Inspect(ctxT(t), name)
		if err != nil || len(info.Holders) != 1 || info.Holders[0].Token != h.Token() {
			t.Fatalf("Inspect = %+v, %v; want token %d", info, err, h.Token())
		}
		h.Release()
	}
	reset := func(sql string) {
		t.Helper()
		if _, err := pool.Exec(ctxT(t), sql); err != nil {
			t.Fatal(err)
		}
	}
	counter := schema + ".pglock_token_counter"
	take()
	take()
	reset("SELECT setval('" + counter + "', 1, false)") // crash recovery
	take()
	reset("SELECT setval('" + counter + "', 1, false)")
	take(pglock.WithMaxConcurrent(2)) // the semaphore path
	take(pglock.WithMaxConcurrent(2))
	// The counter runs out of its epoch's range.
	reset("SELECT setval('" + counter + "', (SELECT e FROM " + schema + ".pglock_epoch) * 4294967296 + 2147483647)")
	take()
	take()
}

// A pool without a statement cache (its statements in another mode, as
// some pooler setups need) still works: the sessions use the pool's mode.
func TestPoolWithoutStatementCache(t *testing.T) {
	pool := newPool(t, func(c *pgxpool.Config) {
		c.ConnConfig.StatementCacheCapacity = 0
		c.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	})
	f := newFactory(t, pool)
	name := uniq(t)
	for _, opts := range [][]pglock.Option{nil, {pglock.WithOwner("o")}, {pglock.WithMaxConcurrent(2)}, {pglock.WithMaxConcurrent(2), pglock.WithOwner("o")}} {
		h, err := f.Acquire(ctxT(t), name+fmt.Sprint(len(opts)), opts...)
		if err != nil {
			t.Fatal(err)
		}
		if err := h.Release(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestListPages: List reads more names than one page holds, each once and
// in byte order; a holder without an owner or metadata is not listed.
func TestListPages(t *testing.T) {
	f := pglock.NewFactory(newPool(t), pglock.WithLogger(nil), pglock.WithKeyPrefix(uniq(t)))
	defer f.Close()
	ctx := ctxT(t)
	var want []string
	for i := range lock.ListPageSize + 2 {
		name := fmt.Sprintf("p/%04d", i)
		h, err := f.Acquire(ctx, name, lock.WithOwner("lister"))
		if err != nil {
			t.Fatal(err)
		}
		defer h.Release()
		want = append(want, name)
	}
	plain, err := f.Acquire(ctx, "p/plain")
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Release()
	var got []string
	for info, err := range f.List(ctx, "p/") {
		if err != nil {
			t.Fatal(err)
		}
		if len(info.Holders) != 1 || info.Holders[0].Owner != "lister" {
			t.Fatalf("List: %+v; want one holder, owner lister", info)
		}
		got = append(got, info.Name)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("List yielded %d names; want %d in order, %q to %q", len(got), len(want), want[0], want[len(want)-1])
	}
}
