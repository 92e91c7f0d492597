package pglock_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/ubgo/lock/internal/testenv"
	"github.com/ubgo/lock/pglock"
)

// holdMany acquires n distinct names with a few goroutines and returns the
// holders.
func holdMany(t testing.TB, pool *pgxpool.Pool, f *pglock.Factory, base string, n int) []*pglock.Holder {
	hs := make([]*pglock.Holder, n)
	const workers = 16
	var wg sync.WaitGroup
	errc := make(chan error, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += workers {
				h, err := f.Acquire(ctxT(t), fmt.Sprintf("%s/tenant-%d", base, i))
				if err != nil {
					errc <- err
					return
				}
				hs[i] = h
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		// The lock table is the server's: say who else fills it.
		var others int
		pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'`).Scan(&others)
		t.Fatalf("%v (advisory locks on the server now: %d)", err, others)
	}
	return hs
}

// connections counts the sessions of app and the advisory locks they hold.
func connections(t testing.TB, pool *pgxpool.Pool, app string) (conns, locks int) {
	err := pool.QueryRow(ctxT(t), `WITH s AS (SELECT pid FROM pg_stat_activity WHERE application_name = $1)
		SELECT (SELECT count(*) FROM s),
		       (SELECT count(*) FROM pg_locks l WHERE l.locktype = 'advisory' AND l.granted AND l.pid IN (SELECT pid FROM s))`,
		app).Scan(&conns, &locks)
	if err != nil {
		t.Fatal(err)
	}
	return conns, locks
}

// Ten thousand held locks need the factory's few sessions, not a
// connection each.
func TestTenThousandLocksFewConnections(t *testing.T) {
	pool := newPool(t)
	app := fmt.Sprintf("pglock-scale-%d", time.Now().UnixNano()%1e9)
	f := newFactory(t, pool, pglock.WithApplicationName(app))
	const n = 10000
	start := time.Now()
	hs := holdMany(t, pool, f, uniq(t), n)
	t.Logf("acquired %d in %v", n, time.Since(start))
	conns, locks := connections(t, pool, app)
	t.Logf("%d locks held over %d connections (pool: %d)", locks, conns, pool.Stat().TotalConns())
	if locks != n {
		t.Fatalf("%d advisory locks held by the factory's sessions, want %d", locks, n)
	}
	if conns > 3 {
		t.Fatalf("%d connections for %d locks; want at most 3 (2 sessions + listener)", conns, n)
	}
	// Release a tenth one by one, then
	// Close gives up the rest at once; under -race on a busy machine ten
	// thousand releases alone take long.
	start = time.Now()
	for _, h := range hs[:n/10] {
		if err := h.Release(); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("released %d in %v", n/10, time.Since(start))
	if _, locks := connections(t, pool, app); locks != n-n/10 {
		t.Fatalf("%d locks held after releasing %d, want %d", locks, n/10, n-n/10)
	}
	f.Close()
	for _, h := range hs[n/10:] {
		<-h.Done()
	}
	// Close closes the sessions' connections; Postgres frees their locks
	// as each backend exits, a moment later.
	testenv.Eventually(t, 30*time.Second, "every lock freed after Close", func() bool {
		_, locks := connections(t, pool, app)
		return locks == 0
	})
}
