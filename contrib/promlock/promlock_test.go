package promlock_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/ubgo/lock"
	"github.com/ubgo/lock/contrib/promlock"
	"github.com/ubgo/lock/internal/testenv"
	"github.com/ubgo/lock/memlock"
)

// setup returns an observer registered on a pedantic registry (which checks
// what is collected against what is described) and a memlock factory that
// reports to it, whose hold times follow a manual clock.
func setup(t *testing.T, opts ...promlock.Option) (*promlock.Observer, *prometheus.Registry, *memlock.Factory, *memlock.ManualClock) {
	t.Helper()
	obs := promlock.New(opts...)
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(obs)
	clock := memlock.NewManualClock(time.Unix(0, 0))
	f := memlock.NewFactory(memlock.WithObserver(obs), memlock.WithLogger(nil), memlock.WithClock(clock))
	t.Cleanup(func() { f.Close() })
	return obs, reg, f, clock
}

// histogram returns the sample count and sum of the series of name with
// the given label values (in the order of the metric's labels).
func histogram(t *testing.T, reg prometheus.Gatherer, name string, values ...string) (uint64, float64) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			for i, l := range m.GetLabel() {
				if i >= len(values) || l.GetValue() != values[i] {
					continue series
				}
			}
			return m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum()
		}
	}
	return 0, 0
}

func checkHistogram(t *testing.T, reg prometheus.Gatherer, wantCount uint64, wantSum float64, name string, values ...string) {
	t.Helper()
	n, sum := histogram(t, reg, name, values...)
	if n != wantCount || (wantSum >= 0 && sum != wantSum) {
		t.Errorf("%s%q: %d samples summing to %v; want %d (sum %v)", name, values, n, sum, wantCount, wantSum)
	}
}

type acquired struct {
	h   *memlock.Holder
	err error
}

// queue starts an Acquire of name that waits (WithWait) and returns once
// it has queued behind the holder, so that it reports a wait.
func queue(t *testing.T, ctx context.Context, f *memlock.Factory, name string) <-chan acquired {
	t.Helper()
	n := f.Waiting(name)
	ch := make(chan acquired, 1)
	go func() {
		h, err := f.Acquire(ctx, name, memlock.WithWait())
		ch <- acquired{h, err}
	}()
	testenv.Eventually(t, 5*time.Second, "the Acquire queued", func() bool { return f.Waiting(name) != n })
	return ch
}

// giveUp starts an Acquire of the held name that waits, and cancels it
// once queued: its wait is reported with the outcome locked.
func giveUp(t *testing.T, f *memlock.Factory, name string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ch := queue(t, ctx, f, name)
	cancel()
	if r := <-ch; !errors.Is(r.err, lock.ErrLocked) {
		t.Fatalf("cancelled wait: %v, want ErrLocked", r.err)
	}
}

// TestMetrics drives a memlock factory through acquire, contention,
// extend, a wait granted by a release, a wait given up, and a forced
// loss followed by the loser's Release, and checks every metric.
func TestMetrics(t *testing.T) {
	_, reg, f, clock := setup(t)
	ctx := context.Background()

	h1, err := f.Acquire(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Acquire(ctx, "job"); !errors.Is(err, lock.ErrLocked) {
		t.Fatalf("second Acquire: %v, want ErrLocked", err)
	}
	if err := h1.Extend(ctx); err != nil {
		t.Fatal(err)
	}
	checkHeld(t, reg, "memlock", 1)

	granted := queue(t, ctx, f, "job")
	clock.Advance(2 * time.Second)
	if err := h1.Release(); err != nil {
		t.Fatal(err)
	}
	r := <-granted
	if r.err != nil {
		t.Fatal(r.err)
	}
	h2 := r.h
	checkHeld(t, reg, "memlock", 1)
	giveUp(t, f, "job")

	clock.Advance(3 * time.Second)
	if n := f.ForceLoss("job"); n != 1 {
		t.Fatalf("ForceLoss: %d holders lost, want 1", n)
	}
	if err := h2.Release(); !errors.Is(err, lock.ErrLockLost) {
		t.Fatalf("Release after loss: %v, want ErrLockLost", err)
	}

	want := `
# HELP lock_held Locks (or semaphore permits) held now.
# TYPE lock_held gauge
lock_held{backend="memlock"} 0
# HELP lock_lost_total Locks lost while held, by why (expired, session, removed, max_hold, other), except to the factory's Close.
# TYPE lock_lost_total counter
lock_lost_total{backend="memlock",reason="removed"} 1
# HELP lock_operations_total Lock operations (acquire, release, extend, lost) by outcome.
# TYPE lock_operations_total counter
lock_operations_total{backend="memlock",op="acquire",outcome="locked"} 2
lock_operations_total{backend="memlock",op="acquire",outcome="ok"} 2
lock_operations_total{backend="memlock",op="extend",outcome="ok"} 1
lock_operations_total{backend="memlock",op="lost",outcome="lost"} 1
lock_operations_total{backend="memlock",op="release",outcome="ok"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "lock_held", "lock_lost_total", "lock_operations_total"); err != nil {
		t.Error(err)
	}
	// Acquire and wait times are real time: only their counts are exact.
	checkHistogram(t, reg, 2, -1, "lock_acquire_duration_seconds", "memlock", "ok")
	checkHistogram(t, reg, 2, -1, "lock_acquire_duration_seconds", "memlock", "locked")
	checkHistogram(t, reg, 2, -1, "lock_wait_duration_seconds", "memlock") // the granted wait and the cancelled one
	checkHistogram(t, reg, 1, 2, "lock_hold_duration_seconds", "memlock", "ok")
	checkHistogram(t, reg, 1, 3, "lock_hold_duration_seconds", "memlock", "lost")

	if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) > 0 {
		t.Errorf("lint: %v %+v", err, problems)
	}
}

// checkHeld checks the lock_held gauge of memlock.
func checkHeld(t *testing.T, reg prometheus.Gatherer, backend string, n int) {
	t.Helper()
	want := fmt.Sprintf(`
# HELP lock_held Locks (or semaphore permits) held now.
# TYPE lock_held gauge
lock_held{backend=%q} %d
`, backend, n)
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "lock_held"); err != nil {
		t.Error(err)
	}
}

// TestSemaphorePermits: each permit of a semaphore counts as one held lock.
func TestSemaphorePermits(t *testing.T) {
	_, reg, f, _ := setup(t)
	ctx := context.Background()
	var hs []*memlock.Holder
	for range 3 {
		h, err := f.Acquire(ctx, "pool", memlock.WithMaxConcurrent(3))
		if err != nil {
			t.Fatal(err)
		}
		hs = append(hs, h)
	}
	checkHeld(t, reg, "memlock", 3)
	hs[1].Release()
	hs[1].Release() // idempotent: reports nothing
	checkHeld(t, reg, "memlock", 2)
	f.ForceLoss("pool")
	checkHeld(t, reg, "memlock", 0)
	checkHistogram(t, reg, 1, -1, "lock_hold_duration_seconds", "memlock", "ok")
	checkHistogram(t, reg, 2, -1, "lock_hold_duration_seconds", "memlock", "lost")
}

// TestEndReportedTwice: redislock reports a Release that could not reach
// Redis (outcome error) and later the loss of the same holder. The holder
// ends once: the gauge drops once and the hold is observed once, while
// the loss is still counted.
func TestEndReportedTwice(t *testing.T) {
	obs := promlock.New()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(obs)
	ctx := context.Background()
	e := lock.Event{Backend: "redislock", Name: "job", Token: 7}
	acquired, released, lost := e, e, e
	acquired.Op, acquired.Outcome = lock.OpAcquire, lock.OutcomeOK
	released.Op, released.Outcome, released.Held = lock.OpRelease, lock.OutcomeError, time.Second
	lost.Op, lost.Outcome, lost.Held, lost.Err = lock.OpLost, lock.OutcomeLost, 2*time.Second, fmt.Errorf("redislock: %w: renewal failed", lock.ErrLeaseExpired)
	for _, e := range []lock.Event{acquired, released, lost} {
		obs.Observe(ctx, e)
	}
	checkHeld(t, reg, "redislock", 0)
	checkHistogram(t, reg, 1, 1, "lock_hold_duration_seconds", "redislock", "error")
	checkHistogram(t, reg, 0, 0, "lock_hold_duration_seconds", "redislock", "lost")
	want := `
# HELP lock_lost_total Locks lost while held, by why (expired, session, removed, max_hold, other), except to the factory's Close.
# TYPE lock_lost_total counter
lock_lost_total{backend="redislock",reason="expired"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "lock_lost_total"); err != nil {
		t.Error(err)
	}
}

// TestClose: locks lost to the factory's Close (a shutdown) are no longer
// held, but are not counted as lost.
func TestClose(t *testing.T) {
	obs, reg, f, clock := setup(t)
	if _, err := f.Acquire(context.Background(), "job"); err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Second)
	f.Close()
	checkHeld(t, reg, "memlock", 0)
	checkHistogram(t, reg, 1, 1, "lock_hold_duration_seconds", "memlock", "lost")
	if n := testutil.CollectAndCount(obs, "lock_lost_total"); n != 0 {
		t.Errorf("%d lock_lost_total series after Close, want none", n)
	}
}

// TestNamespace: WithNamespace prefixes every name, and the names pass
// the Prometheus linter.
func TestNamespace(t *testing.T) {
	_, reg, f, _ := setup(t, promlock.WithNamespace("app"))
	ctx := context.Background()
	h, err := f.Acquire(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	giveUp(t, f, "job")
	h.Release()
	f.Acquire(ctx, "job")
	f.ForceLoss("job")
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, mf := range mfs {
		names = append(names, mf.GetName())
	}
	want := []string{
		"app_lock_acquire_duration_seconds", "app_lock_held", "app_lock_hold_duration_seconds",
		"app_lock_lost_total", "app_lock_operations_total", "app_lock_wait_duration_seconds",
	}
	if !slices.Equal(names, want) {
		t.Errorf("metric names %q, want %q", names, want)
	}
	if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) > 0 {
		t.Errorf("lint: %v %+v", err, problems)
	}
}

// WithClass labels the series of held locks, so that a leader's lock held
// for hours is told from a stuck job's; lost locks say why.
func TestClassAndReason(t *testing.T) {
	obs := promlock.New(promlock.WithClass(func(name string) string {
		if strings.HasPrefix(name, "leader/") {
			return "long-lived"
		}
		return "job"
	}))
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(obs)
	f := memlock.NewFactory(memlock.WithObserver(obs))
	defer f.Close()
	ctx := context.Background()
	if _, err := f.Acquire(ctx, "leader/api"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Acquire(ctx, "export", memlock.WithMaxHold(time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	want := `
# HELP lock_held Locks (or semaphore permits) held now.
# TYPE lock_held gauge
lock_held{backend="memlock",class="job"} 0
lock_held{backend="memlock",class="long-lived"} 1
# HELP lock_lost_total Locks lost while held, by why (expired, session, removed, max_hold, other), except to the factory's Close.
# TYPE lock_lost_total counter
lock_lost_total{backend="memlock",class="job",reason="max_hold"} 1
`
	var err error
	if !testenv.Poll(10*time.Second, func() bool { // the max hold's timer
		err = testutil.GatherAndCompare(reg, strings.NewReader(want), "lock_held", "lock_lost_total")
		return err == nil
	}) {
		t.Fatal(err)
	}
}
