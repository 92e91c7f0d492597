package tests

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/internal/testenv"
	"github.com/ubgo/lock/locktest"
	"github.com/ubgo/lock/memlock"
)

// A target is one backend the pattern helpers run on. Only memlock is here
// today; a network backend joins by adding an entry whose locker returns a
// client of its shared server, whose lose kills the holder's lease or
// session for real, and whose lossBound is its loss detection time. A
// SIGKILL of a leader process belongs beside these tests, re-executing the
// test binary with internal/testenv.
type target struct {
	name string
	// locker returns the Locker of one replica; every replica shares one
	// store. opts are the replica's defaults (WithOwner, WithWait, ...).
	locker func(opts ...lock.Option) lock.Locker
	// inspector sees the shared store, for CurrentLeader.
	inspector lock.Inspector
	// lose makes the current holders of name lose their lock the way the
	// backend loses one in production.
	lose func(t testing.TB, name string)
	// lossBound is how long the backend may take to report a loss.
	lossBound time.Duration
}

func targets(t *testing.T) []target {
	f := memlock.NewFactory(memlock.WithLogger(nil))
	t.Cleanup(func() { f.Close() })
	return []target{{
		name:      "memlock",
		locker:    func(opts ...lock.Option) lock.Locker { return f.AsLocker(opts...) },
		inspector: f,
		lose: func(t testing.TB, name string) {
			if f.ForceLoss(name) == 0 {
				t.Errorf("ForceLoss(%q): nobody held it", name)
			}
		},
		lossBound: 10 * time.Second,
	}}
}

func forEach(t *testing.T, fn func(t *testing.T, tg target)) {
	for _, tg := range targets(t) {
		t.Run(tg.name, func(t *testing.T) { fn(t, tg) })
	}
}

// bound is the generous deadline for anything the tests wait on: the
// machine is small and noisy, and nothing here asserts on speed.
const bound = 10 * time.Second

func recv[T any](t testing.TB, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(bound):
		t.Fatalf("%s: not within %v", what, bound)
		panic("unreachable")
	}
}

// checker counts holders inside a critical section at once.
type checker struct {
	inside, worst atomic.Int32
}

func (c *checker) enter() {
	n := c.inside.Add(1)
	for {
		w := c.worst.Load()
		if n <= w || c.worst.CompareAndSwap(w, n) {
			return
		}
	}
}
func (c *checker) leave() { c.inside.Add(-1) }

type term struct {
	replica int
	epoch   uint64
	ctx     context.Context
	wrote   chan struct{} // closed after the term's first fenced write
	resign  chan struct{} // closing it makes work return
}

// leaders runs n replicas of lock.Lead. Each term's work writes the report
// through the fence with its epoch, then waits until its context ends or it
// resigns. A deposed leader winds down by trying one more write once a
// newer epoch has written — the write of a leader that paused past its
// lease — and records how the fence answered on stale.
type leaders struct {
	terms  chan term
	stale  chan error
	stop   []context.CancelFunc
	fence  *lock.MemoryFence
	mu     sync.Mutex
	writes []uint64 // epochs of accepted writes, in order
	work   checker  // leaders inside work at once
}

func startLeaders(t *testing.T, tg target, n int, name string, opts ...lock.Option) *leaders {
	ls := &leaders{terms: make(chan term, 64), stale: make(chan error, 64), fence: lock.NewMemoryFence()}
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		ctx, cancel := context.WithCancel(context.Background())
		ls.stop = append(ls.stop, cancel)
		l := tg.locker(append([]lock.Option{lock.WithOwner(fmt.Sprint("replica-", i))}, opts...)...)
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := lock.Lead(ctx, l, name, func(ctx context.Context, epoch uint64) error {
				ls.work.enter()
				defer ls.work.leave()
				tm := term{replica: i, epoch: epoch, ctx: ctx, wrote: make(chan struct{}), resign: make(chan struct{})}
				if err := ls.write(ctx, epoch); err != nil {
					return err
				}
				close(tm.wrote)
				ls.terms <- tm
				select {
				case <-tm.resign:
					return nil
				case <-ctx.Done():
				}
				if !errors.Is(context.Cause(ctx), lock.ErrLockLost) {
					return nil // shut down or stepped down: nothing in flight
				}
				testenv.Poll(bound, func() bool { return ls.fence.Highest("report") != epoch })
				ls.stale <- ls.write(context.Background(), epoch)
				return nil
			}, lock.WithLeadRetry(10*time.Millisecond), lock.WithLeadLogger(nil))
			if !errors.Is(err, context.Canceled) {
				t.Errorf("replica %d: Lead = %v", i, err)
			}
		}()
	}
	t.Cleanup(func() {
		for _, c := range ls.stop {
			c()
		}
		wg.Wait()
	})
	return ls
}

func (ls *leaders) write(ctx context.Context, epoch uint64) error {
	return ls.fence.Apply(ctx, "report", epoch, func() error {
		ls.mu.Lock()
		ls.writes = append(ls.writes, epoch)
		ls.mu.Unlock()
		return nil
	})
}

func (ls *leaders) checkWrites(t *testing.T) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	for i := 1; i < len(ls.writes); i++ {
		if ls.writes[i] < ls.writes[i-1] {
			t.Fatalf("epoch %d wrote after epoch %d: %v", ls.writes[i], ls.writes[i-1], ls.writes)
		}
	}
}

// TestLeadForcedLoss: the leader loses its lock behind its back; its work
// is cancelled with ErrLockLost, another replica takes over with a higher
// epoch, and the deposed leader's late write is refused by the fence.
func TestLeadForcedLoss(t *testing.T) {
	forEach(t, func(t *testing.T, tg target) {
		ls := startLeaders(t, tg, 3, "leader")
		var last uint64
		for round := 0; round < 5; round++ {
			tm := recv(t, ls.terms, "election")
			if tm.epoch <= last {
				t.Fatalf("round %d: epoch %d after %d", round, tm.epoch, last)
			}
			last = tm.epoch
			info, ok, err := lock.CurrentLeader(context.Background(), tg.inspector, "leader")
			if err != nil || !ok || info.Token != tm.epoch || info.Owner != fmt.Sprint("replica-", tm.replica) {
				t.Fatalf("round %d: CurrentLeader = %+v %v %v; working leader is replica-%d epoch %d", round, info, ok, err, tm.replica, tm.epoch)
			}
			start := time.Now()
			tg.lose(t, "leader")
			select {
			case <-tm.ctx.Done():
			case <-time.After(tg.lossBound):
				t.Fatalf("round %d: work not cancelled within %v of the loss", round, tg.lossBound)
			}
			if !errors.Is(context.Cause(tm.ctx), lock.ErrLockLost) {
				t.Fatalf("round %d: cause %v", round, context.Cause(tm.ctx))
			}
			next := recv(t, ls.terms, "takeover")
			t.Logf("round %d: replica-%d (epoch %d) took over from replica-%d (epoch %d) in %v",
				round, next.replica, next.epoch, tm.replica, tm.epoch, time.Since(start).Round(time.Millisecond))
			if next.epoch <= tm.epoch {
				t.Fatalf("round %d: takeover epoch %d not above %d", round, next.epoch, tm.epoch)
			}
			if err := recv(t, ls.stale, "the deposed leader's late write"); !errors.Is(err, lock.ErrStaleToken) {
				t.Fatalf("round %d: deposed leader's write = %v, want ErrStaleToken", round, err)
			}
			ls.terms <- next // the next round deposes it
		}
		ls.checkWrites(t)
	})
}

// TestLeadRotation: terms that end cleanly — the leader resigns or shuts
// down — hand over without two leaders ever working at once.
func TestLeadRotation(t *testing.T) {
	forEach(t, func(t *testing.T, tg target) {
		ls := startLeaders(t, tg, 3, "rotation")
		stopped := 0
		var last uint64
		for round := 0; round < 12; round++ {
			tm := recv(t, ls.terms, "election")
			if tm.epoch <= last {
				t.Fatalf("epoch %d after %d", tm.epoch, last)
			}
			last = tm.epoch
			if round%4 == 3 && stopped < 2 {
				stopped++
				ls.stop[tm.replica]()
			} else {
				close(tm.resign)
			}
		}
		if w := ls.work.worst.Load(); w != 1 {
			t.Fatalf("%d leaders worked at once", w)
		}
		ls.checkWrites(t)
	})
}

// TestLeadWaitingLocker: with a Locker built WithWait, followers queue in
// Acquire instead of polling, and take over as soon as the leader goes.
func TestLeadWaitingLocker(t *testing.T) {
	forEach(t, func(t *testing.T, tg target) {
		ls := startLeaders(t, tg, 3, "waiting", lock.WithWait())
		first := recv(t, ls.terms, "election")
		tg.lose(t, "waiting")
		second := recv(t, ls.terms, "takeover")
		if second.epoch <= first.epoch || second.replica == first.replica {
			t.Fatalf("takeover %+v after %+v: want a queued follower", second, first)
		}
		if err := recv(t, ls.stale, "late write"); !errors.Is(err, lock.ErrStaleToken) {
			t.Fatalf("late write = %v", err)
		}
	})
}

// TestRunOnceLateReplica is scenario 8: a migration must run once even when
// a replica boots after the first one finished and released the lock.
func TestRunOnceLateReplica(t *testing.T) {
	forEach(t, func(t *testing.T, tg target) {
		ctx := context.Background()
		led := lock.NewMemoryLedger()
		var runs atomic.Int32
		migrate := func(context.Context) error { runs.Add(1); return nil }
		ran, err := lock.RunOnce(ctx, tg.locker(), led, "schema-v7", migrate)
		if !ran || err != nil {
			t.Fatalf("first replica: %v %v", ran, err)
		}
		ran, err = lock.RunOnce(ctx, tg.locker(), led, "schema-v7", migrate)
		if ran || err != nil || runs.Load() != 1 {
			t.Fatalf("late replica: ran %v err %v; migration ran %d times", ran, err, runs.Load())
		}
	})
}

// TestRunOnceBootStorm: replicas booting together with a waiting locker
// queue behind the one that migrates, then all go on, none running it again.
func TestRunOnceBootStorm(t *testing.T) {
	forEach(t, func(t *testing.T, tg target) {
		ctx := context.Background()
		led := lock.NewMemoryLedger()
		var runs atomic.Int32
		var done atomic.Bool
		var wg sync.WaitGroup
		for r := 0; r < 6; r++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, err := lock.RunOnce(ctx, tg.locker(lock.WithWait()), led, "schema-v8", func(context.Context) error {
					runs.Add(1)
					time.Sleep(20 * time.Millisecond)
					done.Store(true)
					return nil
				})
				if err != nil {
					t.Errorf("replica %d: %v", r, err)
				}
				if !done.Load() {
					t.Errorf("replica %d went on before the migration finished", r)
				}
			}()
		}
		wg.Wait()
		if runs.Load() != 1 {
			t.Fatalf("migration ran %d times", runs.Load())
		}
	})
}

// TestRunOncePerDay is scenario 10: ten hosts fire the daily backup at
// slightly different times over two days; each day's backup runs once.
func TestRunOncePerDay(t *testing.T) {
	forEach(t, func(t *testing.T, tg target) {
		ctx := context.Background()
		led := lock.NewMemoryLedger()
		var mu sync.Mutex
		ranOn := map[string]int{}
		for _, day := range []time.Time{
			time.Date(2026, 5, 4, 0, 0, 0, 0, time.UTC),
			time.Date(2026, 5, 5, 0, 0, 0, 0, time.UTC),
		} {
			var wg sync.WaitGroup
			for host := 0; host < 10; host++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					time.Sleep(time.Duration(host) * 3 * time.Millisecond) // hosts' timers drift
					_, err := lock.RunOncePer(ctx, tg.locker(), led, "backup", 24*time.Hour, day, func(context.Context) error {
						mu.Lock()
						ranOn[day.Format(time.DateOnly)]++
						mu.Unlock()
						time.Sleep(10 * time.Millisecond)
						return nil
					})
					if err != nil && !errors.Is(err, lock.ErrLocked) {
						t.Errorf("host %d: %v", host, err)
					}
				}()
			}
			wg.Wait()
		}
		if len(ranOn) != 2 || ranOn["2026-05-04"] != 1 || ranOn["2026-05-05"] != 1 {
			t.Fatalf("backups per day: %v", ranOn)
		}
	})
}

// TestHoldAtLeast: a replica whose tick fires after the winner finished,
// but within the hold, still finds the tick taken.
func TestHoldAtLeast(t *testing.T) {
	forEach(t, func(t *testing.T, tg target) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		finished := make(chan struct{})
		errc := make(chan error, 1)
		go func() {
			errc <- lock.HoldAtLeast(ctx, tg.locker(), "refresh@12:00", time.Hour, func(context.Context) error {
				close(finished)
				return nil
			})
		}()
		recv(t, finished, "first replica's run")
		time.Sleep(5 * time.Millisecond)
		err := lock.HoldAtLeast(context.Background(), tg.locker(), "refresh@12:00", time.Hour, func(context.Context) error {
			t.Error("the late replica ran the tick again")
			return nil
		})
		if !errors.Is(err, lock.ErrLocked) {
			t.Fatalf("late replica: %v", err)
		}
		cancel()
		if err := recv(t, errc, "hold cut short"); err != nil {
			t.Fatal(err)
		}
	})
}

// TestFenceStaleWriter is scenario 7 on a backend: A loses its lock while
// paused, B takes over and writes, A's write is refused, and A's WithLock
// context is cancelled.
func TestFenceStaleWriter(t *testing.T) {
	forEach(t, func(t *testing.T, tg target) {
		fence := lock.NewMemoryFence()
		aWrites := make(chan error)
		bWrote := make(chan struct{})
		aErr := make(chan error, 1)
		var aToken uint64
		a := tg.locker()
		capture := lock.LockerFunc(func(ctx context.Context, name string) (lock.Holder, error) {
			h, err := a.Acquire(ctx, name)
			if err == nil {
				aToken = h.Token()
			}
			return h, err
		})
		go func() {
			aErr <- lock.WithLock(context.Background(), capture, "export", func(ctx context.Context) error {
				aWrites <- nil
				<-bWrote // A is paused while B works
				select {
				case <-ctx.Done():
				case <-time.After(bound):
				}
				if !errors.Is(context.Cause(ctx), lock.ErrLockLost) {
					t.Errorf("A's context: %v", context.Cause(ctx))
				}
				return fence.RejectIfStale(context.Background(), "payments/today.csv", aToken)
			})
		}()
		recv(t, aWrites, "A holds the lock")
		if _, err := tg.locker().Acquire(context.Background(), "export"); !errors.Is(err, lock.ErrLocked) {
			t.Fatalf("B while A holds: %v", err)
		}
		tg.lose(t, "export")
		h, err := tg.locker().Acquire(context.Background(), "export")
		if err != nil {
			t.Fatal(err)
		}
		defer h.Release()
		if err := fence.RejectIfStale(context.Background(), "payments/today.csv", h.Token()); err != nil {
			t.Fatal(err)
		}
		close(bWrote)
		err = recv(t, aErr, "A's WithLock")
		if !errors.Is(err, lock.ErrStaleToken) || !errors.Is(err, lock.ErrLockLost) {
			t.Fatalf("A's WithLock = %v; want its refused write and the loss", err)
		}
	})
}

// TestSemaphoreWaitPool is scenario 5 without the sleep loop: WithWait and
// WithMaxConcurrent queue the batches for three slots.
func TestSemaphoreWaitPool(t *testing.T) {
	forEach(t, func(t *testing.T, tg target) {
		ctx := context.Background()
		indexers := tg.locker(lock.WithMaxConcurrent(3), lock.WithWait())
		var c checker
		var done atomic.Int32
		var wg sync.WaitGroup
		for b := 0; b < 20; b++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				err := lock.WithLock(ctx, indexers, "indexer", func(ctx context.Context) error {
					c.enter()
					defer c.leave()
					time.Sleep(2 * time.Millisecond)
					done.Add(1)
					return nil
				})
				if err != nil {
					t.Errorf("batch %d: %v", b, err)
				}
			}()
		}
		wg.Wait()
		if done.Load() != 20 || c.worst.Load() > 3 {
			t.Fatalf("%d batches done, %d at once (limit 3)", done.Load(), c.worst.Load())
		}
	})
}

// TestKeepAlive: a bare Acquire with a lease stays held while KeepAlive
// renews it, and the work's context is cancelled when it is lost anyway.
// The lease runs on a manual clock, so nothing here depends on timing.
func TestKeepAlive(t *testing.T) {
	var extends atomic.Int32
	obs := lock.ObserverFunc(func(_ context.Context, e lock.Event) {
		if e.Op == lock.OpExtend && e.Err == nil {
			extends.Add(1)
		}
	})
	clock := memlock.NewManualClock(time.Unix(0, 0))
	f := memlock.NewFactory(memlock.WithClock(clock), memlock.WithTTL(time.Minute), memlock.WithObserver(obs), memlock.WithLogger(nil))
	defer f.Close()
	h, err := f.Acquire(context.Background(), "daily-export")
	if err != nil {
		t.Fatal(err)
	}
	defer h.Release()
	ctx, cancel := lock.KeepAlive(context.Background(), h, time.Millisecond)
	defer cancel()
	for i := 0; i < 5; i++ {
		n := extends.Load()
		testenv.Eventually(t, bound, "a renewal", func() bool { return extends.Load() > n })
		clock.Advance(50 * time.Second) // past the TTL in total, never between renewals
	}
	if h.Err() != nil || ctx.Err() != nil {
		t.Fatalf("lease lost while renewed: %v / %v", h.Err(), ctx.Err())
	}
	f.ForceLoss("daily-export")
	<-ctx.Done()
	if !errors.Is(context.Cause(ctx), memlock.ErrLockLost) {
		t.Fatalf("cause %v", context.Cause(ctx))
	}
}

func TestMemoryFenceConformance(t *testing.T) {
	shared := lock.NewMemoryFence()
	locktest.RunFence(t, func(testing.TB) lock.Fence { return shared })
}

func TestMemoryLedgerConformance(t *testing.T) {
	shared := lock.NewMemoryLedger()
	locktest.RunLedger(t, func(testing.TB) lock.Ledger { return shared })
}
