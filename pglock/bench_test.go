package pglock_test

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/ubgo/lock/internal/testenv"
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
				waitForWaiter(b, pool, name)
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

type contendedResult struct {
	acqs, retakes    int
	elapsed, maxWait time.Duration
	handoffs         []time.Duration
	stmts            int64 // sent by the workers' clients
	xacts            int64 // the server's xact_commit delta: includes other clients of the database
}

// runContended has n workers take and release the lock until total
// acquisitions are done. A hand-off is the time from a release by one
// worker to the acquire of another returning; a retake is a worker taking
// the lock again right after releasing it.
func runContended(b *testing.B, mon *pgxpool.Pool, n, total int, mk func(pool func() *pgxpool.Pool, atEnd func(func())) func(ctx context.Context) (func() error, error)) contendedResult {
	app := fmt.Sprintf("pglock-bench-%d", time.Now().UnixNano()%1e9)
	var cnt counter
	var pools []*pgxpool.Pool
	var ends []func()
	atEnd := func(f func()) { ends = append(ends, f) }
	newPool := func() *pgxpool.Pool {
		p := newPool(b, func(c *pgxpool.Config) {
			c.ConnConfig.Tracer = &cnt
			c.ConnConfig.RuntimeParams["application_name"] = app
		})
		pools = append(pools, p)
		return p
	}
	xacts := func() int64 {
		var x int64
		if err := mon.QueryRow(context.Background(), "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()").Scan(&x); err != nil {
			b.Fatal(err)
		}
		return x
	}
	// A round of 10 acquisitions each first, which every client's
	// connections are opened in. The server counts a backend's statements
	// only when it reports them (at most once a second, and at exit), so
	// the server's count is taken from before it, less the round's
	// statements as the clients counted them.
	x0 := xacts()
	cnt.n.Store(0)
	acquire := make([]func(ctx context.Context) (func() error, error), n)
	for i := range acquire {
		acquire[i] = mk(newPool, atEnd)
	}
	phase(b, acquire, 10*n)
	x0 += cnt.n.Load()
	cnt.n.Store(0)
	r := phase(b, acquire, total)
	r.stmts = cnt.n.Load()
	// Backends report their counts to the server's statistics when they
	// exit: close every client, then read.
	for _, f := range ends {
		f()
	}
	for _, p := range pools {
		p.Close()
	}
	b.StopTimer()
	var left int
	if !testenv.Poll(30*time.Second, func() bool {
		if err := mon.QueryRow(context.Background(), "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE $1 || '%'", app).Scan(&left); err != nil {
			b.Fatal(err)
		}
		return left == 0
	}) {
		b.Fatalf("%d backends of the run still there", left)
	}
	r.xacts = xacts() - x0
	b.StartTimer()
	slices.Sort(r.handoffs)
	return r
}

// phase has the workers take and release the lock until total
// acquisitions are done.
func phase(b *testing.B, acquire []func(ctx context.Context) (func() error, error), total int) contendedResult {
	var (
		mu      sync.Mutex // guards the fields below, taken by the holder only
		last    = -1
		lastRel time.Time
		r       contendedResult
		left    = total
	)
	start := time.Now()
	var wg sync.WaitGroup
	for i := range acquire {
		wg.Go(func() {
			for {
				t0 := time.Now()
				rel, err := acquire[i](context.Background())
				got := time.Now()
				if err != nil {
					b.Error(err)
					return
				}
				mu.Lock()
				done := left <= 0
				if !done {
					left--
					r.acqs++
					r.maxWait = max(r.maxWait, got.Sub(t0))
					if last == i {
						r.retakes++
					} else if last >= 0 {
						r.handoffs = append(r.handoffs, got.Sub(lastRel))
					}
					last, lastRel = i, time.Now()
				}
				mu.Unlock()
				if err := rel(); err != nil {
					b.Error(err)
					return
				}
				if done {
					return
				}
			}
		})
	}
	wg.Wait()
	r.elapsed = time.Since(start)
	return r
}

// BenchmarkContendedWaiters puts N waiting processes (each its own pool
// and factory) on one name beside N dedicated connections blocking in
// pg_advisory_lock, in the same run: hand-off p50, throughput, statements
// per acquisition (counted by the clients, and the server's xact_commit,
// which other clients of the database add to), max wait, and the share of
// retakes. b.N is the number of acquisitions of each side.
func BenchmarkContendedWaiters(b *testing.B) {
	mon := newPool(b)
	for _, n := range []int{8, 64} {
		b.Run(fmt.Sprint("waiters-", n), func(b *testing.B) {
			name := fmt.Sprintf("bench/contended/%d", time.Now().UnixNano())
			key := int64(0x636f6e74) // arbitrary, for the floor
			floor := runContended(b, mon, n, b.N, func(pool func() *pgxpool.Pool, atEnd func(func())) func(ctx context.Context) (func() error, error) {
				pc, err := pool().Acquire(context.Background())
				if err != nil {
					b.Fatal(err)
				}
				c := pc.Hijack()
				atEnd(func() { c.Close(context.Background()) })
				return func(ctx context.Context) (func() error, error) {
					if _, err := c.Exec(ctx, "SELECT pg_advisory_lock($1)", key); err != nil {
						return nil, err
					}
					return func() error {
						_, err := c.Exec(ctx, "SELECT pg_advisory_unlock($1)", key)
						return err
					}, nil
				}
			})
			ours := runContended(b, mon, n, b.N, func(pool func() *pgxpool.Pool, atEnd func(func())) func(ctx context.Context) (func() error, error) {
				f := newFactory(b, pool())
				atEnd(func() { f.Close() })
				return func(ctx context.Context) (func() error, error) {
					h, err := f.Acquire(ctx, name, pglock.WithWait())
					if err != nil {
						return nil, err
					}
					return h.Release, nil
				}
			})
			if len(floor.handoffs) == 0 || len(ours.handoffs) == 0 {
				return // too few acquisitions to tell
			}
			report := func(what string, r contendedResult) {
				b.ReportMetric(float64(r.handoffs[len(r.handoffs)/2].Microseconds()), what+"-p50-µs")
				b.ReportMetric(float64(r.acqs)/r.elapsed.Seconds(), what+"-acq/s")
				b.ReportMetric(float64(r.stmts)/float64(r.acqs), what+"-stmts/acq")
				b.ReportMetric(float64(r.xacts)/float64(r.acqs), what+"-xact/acq")
				b.ReportMetric(float64(r.maxWait.Microseconds())/1000, what+"-maxwait-ms")
				b.ReportMetric(100*float64(r.retakes)/float64(r.acqs), what+"-retake-%")
			}
			report("floor", floor)
			report("pglock", ours)
			b.ReportMetric(float64(ours.handoffs[len(ours.handoffs)/2])/float64(floor.handoffs[len(floor.handoffs)/2]), "p50-ratio")
			b.ReportMetric((float64(ours.acqs)/ours.elapsed.Seconds())/(float64(floor.acqs)/floor.elapsed.Seconds()), "throughput-ratio")
		})
	}
}
