package lock_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ubgo/lock"
)

func TestRunOnceLateReplica(t *testing.T) {
	ctx := context.Background()
	s, led := newToyStore(), lock.NewMemoryLedger()
	runs := 0
	fn := func(context.Context) error { runs++; return nil }
	ran, err := lock.RunOnce(ctx, s.locker("replica-1"), led, "migrate-v7", fn)
	if !ran || err != nil || runs != 1 {
		t.Fatalf("first replica: ran %v err %v runs %d", ran, err, runs)
	}
	if tok, ok := led.DoneBy("migrate-v7"); !ok || tok != 1 {
		t.Fatalf("ledger: token %d ok %v", tok, ok)
	}
	// Replica 2 boots after replica 1 finished and released: the lock is
	// free, and only the ledger stops a second run.
	acquires := s.acquires
	ran, err = lock.RunOnce(ctx, s.locker("replica-2"), led, "migrate-v7", fn)
	if ran || err != nil || runs != 1 {
		t.Fatalf("late replica: ran %v err %v runs %d", ran, err, runs)
	}
	if s.acquires != acquires {
		t.Fatal("a recorded key still took the lock")
	}
	led.Forget("migrate-v7")
	if ran, _ := lock.RunOnce(ctx, s.locker("replica-2"), led, "migrate-v7", fn); !ran || runs != 2 {
		t.Fatal("a forgotten key did not run again")
	}
}

// hookLedger calls hook after its first IsDone and then returns that IsDone's
// (by then stale) answer, to force a replica through the window between the
// first ledger check and Acquire.
type hookLedger struct {
	lock.Ledger
	once sync.Once
	hook func()
}

func (l *hookLedger) IsDone(ctx context.Context, key string) (bool, error) {
	done, err := l.Ledger.IsDone(ctx, key)
	l.once.Do(l.hook)
	return done, err
}

func TestRunOnceRechecksUnderLock(t *testing.T) {
	ctx := context.Background()
	s, led := newToyStore(), lock.NewMemoryLedger()
	var runs atomic.Int32
	fn := func(context.Context) error { runs.Add(1); return nil }
	slow := &hookLedger{Ledger: led, hook: func() {
		// Replica 1 runs and finishes while replica 2 is between its first
		// check (not done) and its Acquire.
		if ran, err := lock.RunOnce(ctx, s.locker("replica-1"), led, "k", fn); !ran || err != nil {
			t.Errorf("replica 1: %v %v", ran, err)
		}
	}}
	ran, err := lock.RunOnce(ctx, s.locker("replica-2"), slow, "k", fn)
	if ran || err != nil || runs.Load() != 1 {
		t.Fatalf("replica 2: ran %v err %v; fn ran %d times", ran, err, runs.Load())
	}
	if s.holder("k") != nil {
		t.Fatal("the lock was kept after skipping")
	}
}

func TestRunOnceConcurrentReplicas(t *testing.T) {
	ctx := context.Background()
	s, led := newToyStore(), lock.NewMemoryLedger()
	var runs, locked atomic.Int32
	var wg sync.WaitGroup
	for r := 0; r < 8; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				_, err := lock.RunOnce(ctx, s.locker(fmt.Sprint(r)), led, "k", func(context.Context) error {
					runs.Add(1)
					time.Sleep(time.Millisecond)
					return nil
				})
				if errors.Is(err, lock.ErrLocked) {
					locked.Add(1)
					time.Sleep(time.Millisecond) // someone is on it; look again later
					continue
				}
				if err != nil {
					t.Error(err)
				}
				return
			}
		}()
	}
	wg.Wait()
	if runs.Load() != 1 {
		t.Fatalf("fn ran %d times", runs.Load())
	}
}

func TestRunOnceFailures(t *testing.T) {
	ctx := context.Background()
	boom := errors.New("boom")

	t.Run("fn error is not recorded", func(t *testing.T) {
		s, led := newToyStore(), lock.NewMemoryLedger()
		ran, err := lock.RunOnce(ctx, s.locker("a"), led, "k", func(context.Context) error { return boom })
		if !ran || err != boom {
			t.Fatalf("ran %v err %v", ran, err)
		}
		if _, ok := led.DoneBy("k"); ok || s.holder("k") != nil {
			t.Fatal("failed run recorded, or lock kept")
		}
		if ran, err := lock.RunOnce(ctx, s.locker("a"), led, "k", func(context.Context) error { return nil }); !ran || err != nil {
			t.Fatalf("retry: %v %v", ran, err)
		}
	})
	t.Run("busy", func(t *testing.T) {
		s, led := newToyStore(), lock.NewMemoryLedger()
		h, _ := s.locker("a").Acquire(ctx, "k")
		defer h.Release()
		ran, err := lock.RunOnce(ctx, s.locker("b"), led, "k", func(context.Context) error { t.Error("ran"); return nil })
		if ran || !errors.Is(err, lock.ErrLocked) {
			t.Fatalf("ran %v err %v", ran, err)
		}
	})
	t.Run("lost while running", func(t *testing.T) {
		s, led := newToyStore(), lock.NewMemoryLedger()
		ran, err := lock.RunOnce(ctx, s.locker("a"), led, "k", func(ctx context.Context) error {
			s.loseLease("k")
			<-ctx.Done()
			if !errors.Is(context.Cause(ctx), lock.ErrLockLost) {
				t.Errorf("cause %v", context.Cause(ctx))
			}
			return nil // it had finished anyway
		})
		if !ran || !errors.Is(err, lock.ErrLockLost) {
			t.Fatalf("ran %v err %v", ran, err)
		}
		if _, ok := led.DoneBy("k"); !ok {
			t.Fatal("a completed run was not recorded")
		}
	})
	t.Run("ledger down", func(t *testing.T) {
		s := newToyStore()
		ran, err := lock.RunOnce(ctx, s.locker("a"), failingLedger{done: boom}, "k", func(context.Context) error { t.Error("ran"); return nil })
		if ran || !errors.Is(err, boom) {
			t.Fatalf("ran %v err %v", ran, err)
		}
		ran, err = lock.RunOnce(ctx, s.locker("a"), failingLedger{mark: boom}, "k", func(context.Context) error { return nil })
		if !ran || !errors.Is(err, boom) || s.holder("k") != nil {
			t.Fatalf("MarkDone failing: ran %v err %v", ran, err)
		}
	})
	t.Run("records even when the caller gave up", func(t *testing.T) {
		s, led := newToyStore(), lock.NewMemoryLedger()
		cctx, cancel := context.WithCancel(ctx)
		ran, err := lock.RunOnce(cctx, s.locker("a"), led, "k", func(context.Context) error { cancel(); return nil })
		if _, ok := led.DoneBy("k"); !ran || err != nil || !ok {
			t.Fatalf("ran %v err %v recorded %v", ran, err, ok)
		}
	})
	t.Run("bad input", func(t *testing.T) {
		s, led := newToyStore(), lock.NewMemoryLedger()
		fn := func(context.Context) error { return nil }
		for what, err := range map[string]error{
			"nil locker": second(lock.RunOnce(ctx, nil, led, "k", fn)),
			"nil ledger": second(lock.RunOnce(ctx, s.locker("a"), nil, "k", fn)),
			"nil fn":     second(lock.RunOnce(ctx, s.locker("a"), led, "k", nil)),
			"zero":       second(lock.RunOncePer(ctx, s.locker("a"), led, "k", 0, time.Now(), fn)),
			"hold nil":   lock.HoldAtLeast(ctx, nil, "k", time.Second, fn),
		} {
			if !errors.Is(err, lock.ErrInvalidOption) {
				t.Errorf("%s: %v", what, err)
			}
		}
		if _, err := lock.RunOnce(ctx, s.locker("a"), led, "", fn); !errors.Is(err, lock.ErrInvalidName) {
			t.Errorf("empty key: %v", err)
		}
	})
}

func second(_ bool, err error) error { return err }

type failingLedger struct{ done, mark error }

func (l failingLedger) IsDone(context.Context, string) (bool, error)   { return false, l.done }
func (l failingLedger) MarkDone(context.Context, string, uint64) error { return l.mark }

func TestMemoryLedgerFirstRecordWins(t *testing.T) {
	ctx := context.Background()
	led := lock.NewMemoryLedger()
	if done, _ := led.IsDone(ctx, "k"); done {
		t.Fatal("empty ledger says done")
	}
	led.MarkDone(ctx, "k", 4)
	if err := led.MarkDone(ctx, "k", 9); err != nil {
		t.Fatal(err)
	}
	if tok, _ := led.DoneBy("k"); tok != 4 {
		t.Fatalf("second record replaced the first: %d", tok)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := led.IsDone(cctx, "k"); !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	if err := led.MarkDone(cctx, "x", 1); !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
}

func TestPeriodKey(t *testing.T) {
	at := time.Date(2026, 5, 6, 15, 4, 5, 6, time.FixedZone("X", 2*3600))
	for _, c := range []struct {
		period time.Duration
		want   string
	}{
		{24 * time.Hour, "backup@2026-05-06T00:00:00Z"},
		{time.Hour, "backup@2026-05-06T13:00:00Z"},
		{15 * time.Minute, "backup@2026-05-06T13:00:00Z"},
		{7 * 24 * time.Hour, "backup@2026-05-04T00:00:00Z"}, // a Monday
		{0, "backup@2026-05-06T13:04:05.000000006Z"},
	} {
		if got := lock.PeriodKey("backup", at, c.period); got != c.want {
			t.Errorf("PeriodKey(%v) = %q, want %q", c.period, got, c.want)
		}
	}
}

func TestRunOncePer(t *testing.T) {
	ctx := context.Background()
	s, led := newToyStore(), lock.NewMemoryLedger()
	var days []string
	day := 24 * time.Hour
	ticks := []time.Time{
		time.Date(2026, 5, 4, 0, 0, 0, 0, time.UTC),
		time.Date(2026, 5, 4, 0, 0, 0, 0, time.UTC), // a second replica, same tick
		time.Date(2026, 5, 4, 23, 59, 0, 0, time.UTC),
		time.Date(2026, 5, 5, 0, 0, 0, 0, time.UTC),
	}
	for i, at := range ticks {
		_, err := lock.RunOncePer(ctx, s.locker(fmt.Sprint(i)), led, "backup", day, at, func(context.Context) error {
			days = append(days, at.Format("01-02"))
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if fmt.Sprint(days) != "[05-04 05-05]" {
		t.Fatalf("backups ran on %v", days)
	}
}

func TestHoldAtLeast(t *testing.T) {
	ctx := context.Background()
	t.Run("holds past fn", func(t *testing.T) {
		s := newToyStore()
		hctx, cancel := context.WithCancel(ctx)
		fnDone := make(chan struct{})
		errc := make(chan error, 1)
		go func() {
			errc <- lock.HoldAtLeast(hctx, s.locker("a"), "tick", time.Hour, func(context.Context) error {
				close(fnDone)
				return nil
			})
		}()
		<-fnDone
		time.Sleep(5 * time.Millisecond)
		if _, err := s.locker("late").Acquire(ctx, "tick"); !errors.Is(err, lock.ErrLocked) {
			t.Fatalf("a late replica got the tick: %v", err)
		}
		cancel() // shutdown cuts the hold short
		select {
		case err := <-errc:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("hold not cut short by ctx")
		}
		if s.holder("tick") != nil {
			t.Fatal("lock kept after the hold")
		}
	})
	t.Run("short hold", func(t *testing.T) {
		s := newToyStore()
		boom := errors.New("boom")
		start := time.Now()
		err := lock.HoldAtLeast(ctx, s.locker("a"), "tick", 20*time.Millisecond, func(context.Context) error { return boom })
		if err != boom || time.Since(start) < 20*time.Millisecond || s.holder("tick") != nil {
			t.Fatalf("err %v after %v", err, time.Since(start))
		}
	})
	t.Run("loss ends the hold", func(t *testing.T) {
		s := newToyStore()
		err := lock.HoldAtLeast(ctx, s.locker("a"), "tick", time.Hour, func(context.Context) error {
			s.loseLease("tick")
			return nil
		})
		if !errors.Is(err, lock.ErrLockLost) {
			t.Fatalf("err %v", err)
		}
	})
	t.Run("busy", func(t *testing.T) {
		s := newToyStore()
		h, _ := s.locker("a").Acquire(ctx, "tick")
		defer h.Release()
		if err := lock.HoldAtLeast(ctx, s.locker("b"), "tick", time.Hour, func(context.Context) error { return nil }); !errors.Is(err, lock.ErrLocked) {
			t.Fatalf("err %v", err)
		}
	})
}

func ExampleRunOnce() {
	s := newToyStore() // in production: a backend factory's AsLocker(WithWait())
	led := lock.NewMemoryLedger()
	ctx := context.Background()
	for _, replica := range []string{"replica-1", "replica-2"} {
		ran, err := lock.RunOnce(ctx, s.locker(replica), led, "schema-v7", func(context.Context) error {
			return nil // migrate
		})
		fmt.Println(replica, "ran:", ran, "err:", err)
	}
	// Output:
	// replica-1 ran: true err: <nil>
	// replica-2 ran: false err: <nil>
}
