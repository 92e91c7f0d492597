package pglock_test

import (
	"context"
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/ubgo/lock/pglock"
)

// floorConn is a connection out of the pool that runs the fewest round
// trips a session lock needs: pg_try_advisory_lock, then
// pg_advisory_unlock.
func floorConn(b *testing.B, pool *pgxpool.Pool) (cycle func()) {
	pc, err := pool.Acquire(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	c := pc.Hijack()
	b.Cleanup(func() { c.Close(context.Background()) })
	ctx := context.Background()
	const key = int64(0x706c6f6f72) // arbitrary
	return func() {
		var ok bool
		if err := c.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", pgx.QueryExecModeCacheStatement, key).Scan(&ok); err != nil || !ok {
			b.Fatalf("floor lock: %v %v", ok, err)
		}
		if err := c.QueryRow(ctx, "SELECT pg_advisory_unlock($1)", pgx.QueryExecModeCacheStatement, key).Scan(&ok); err != nil || !ok {
			b.Fatalf("floor unlock: %v %v", ok, err)
		}
	}
}

func pglockCycle(b *testing.B, pool *pgxpool.Pool) (cycle func()) {
	f := newFactory(b, pool)
	ctx := context.Background()
	name := fmt.Sprintf("bench/%d", time.Now().UnixNano())
	return func() {
		h, err := f.Acquire(ctx, name)
		if err != nil {
			b.Fatal(err)
		}
		if err := h.Release(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAcquireRelease puts an uncontended acquire+release beside the
// raw floor on the same server, in the same run.
func BenchmarkAcquireRelease(b *testing.B) {
	pool := newPool(b)
	b.Run("floor", func(b *testing.B) {
		cycle := floorConn(b, pool)
		cycle()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			cycle()
		}
	})
	b.Run("pglock", func(b *testing.B) {
		cycle := pglockCycle(b, pool)
		cycle()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			cycle()
		}
	})
}

// BenchmarkAcquireReleaseVsFloor alternates blocks of floor and pglock
// cycles, so that the noise of a shared machine hits both alike, and
// reports both costs and their ratio.
func BenchmarkAcquireReleaseVsFloor(b *testing.B) {
	pool := newPool(b)
	floor, ours := floorConn(b, pool), pglockCycle(b, pool)
	floor()
	ours()
	const block = 50
	var tf, to time.Duration
	b.ResetTimer()
	for done := 0; done < b.N; done += block {
		n := min(block, b.N-done)
		start := time.Now()
		for i := 0; i < n; i++ {
			floor()
		}
		tf += time.Since(start)
		start = time.Now()
		for i := 0; i < n; i++ {
			ours()
		}
		to += time.Since(start)
	}
	b.ReportMetric(float64(tf.Nanoseconds())/float64(b.N), "floor-ns/op")
	b.ReportMetric(float64(to.Nanoseconds())/float64(b.N), "pglock-ns/op")
	b.ReportMetric(float64(to)/float64(tf), "ratio")
}

// BenchmarkHandoff measures the time from a holder's Release to a waiter's
// Acquire returning: across factories (another process: the release's
// NOTIFY wakes the waiter) and within one (an in-process wake-up).
func BenchmarkHandoff(b *testing.B) {
	pool := newPool(b)
	for _, tc := range []struct {
		what      string
		sameProcs bool
	}{{"notify", false}, {"in-process", true}} {
		b.Run(tc.what, func(b *testing.B) {
			holder := newFactory(b, pool, pglock.WithPollInterval(time.Hour))
			waiter := holder
			if !tc.sameProcs {
				waiter = newFactory(b, pool, pglock.WithPollInterval(time.Hour))
			}
			name := fmt.Sprintf("bench/handoff/%d", time.Now().UnixNano())
			ctx := context.Background()
			lat := make([]time.Duration, 0, b.N)
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				h, err := holder.Acquire(ctx, name)
				if err != nil {
					b.Fatal(err)
				}
				got := make(chan time.Time, 1)
				go func() {
					w, err := waiter.Acquire(ctx, name, pglock.WithWait())
					now := time.Now()
					if err != nil {
						b.Error(err)
					} else {
						w.Release()
					}
					got <- now
				}()
				waitForWaiterB(b, pool, name)
				b.StartTimer()
				t0 := time.Now()
				h.Release()
				t1 := <-got
				lat = append(lat, t1.Sub(t0))
			}
			sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
			b.ReportMetric(float64(lat[len(lat)*9/10].Microseconds()), "p90-µs")
		})
	}
}

func waitForWaiterB(b *testing.B, pool *pgxpool.Pool, name string) {
	for i := 0; ; i++ {
		var n int
		err := pool.QueryRow(context.Background(), `SELECT count(*) FROM (`+waiterPIDs+`) w`, name).Scan(&n)
		if err != nil {
			b.Fatal(err)
		}
		if n > 0 {
			return // blocked in Postgres, or marked and about to retry once
		}
		if i > 10000 {
			b.Fatal("waiter never registered")
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// BenchmarkHold10k holds 10,000 locks at once and reports how many
// connections that takes.
func BenchmarkHold10k(b *testing.B) {
	pool := newPool(b)
	app := fmt.Sprintf("pglock-bench-%d", time.Now().UnixNano()%1e9)
	f := newFactory(b, pool, pglock.WithApplicationName(app))
	const n = 10000
	var conns int
	for i := 0; i < b.N; i++ {
		hs := holdMany(b, pool, f, fmt.Sprintf("bench/hold/%d/%d", time.Now().UnixNano(), i), n)
		b.StopTimer()
		conns, _ = connections(b, pool, app)
		b.StartTimer()
		for _, h := range hs {
			h.Release()
		}
	}
	b.ReportMetric(float64(conns), "conns")
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/lock")
}
