package memlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/internal/testenv"
	"github.com/ubgo/lock/locktest"
	"github.com/ubgo/lock/memlock"
)

func TestConformance(t *testing.T) {
	f := memlock.NewFactory()
	locktest.Run(t, locktest.Backend{
		New:         func(t testing.TB, opts ...lock.Option) lock.Locker { return f.AsLocker(opts...) },
		ErrLocked:   memlock.ErrLocked,
		ErrLockLost: memlock.ErrLockLost,
		Wait:        true,
		Semaphore:   true,
		Extend:      true,
		Shared:      true,
		TTL:         50 * time.Millisecond,
		Inspector:   func(testing.TB) lock.Inspector { return f },
		Lister:      func(testing.TB) lock.Lister { return f },
		Lose:        func(t testing.TB, h lock.Holder) { f.ForceLoss(h.(*memlock.Holder).Name()) },
		Waiting:     f.Waiting,
		FIFO:        func(_ testing.TB, opts ...lock.Option) lock.Locker { return f.AsLocker(opts...) },
		// A factory is a store of its own: the closed one shares nothing
		// with f.
		NewFactory: func(_ testing.TB, opts ...lock.Option) locktest.Factory { return memlock.NewFactory(opts...) },
		Name:       "memlock",
		Clock: func(t testing.TB) (func(...lock.Option) lock.Locker, func(time.Duration)) {
			c := memlock.NewManualClock(time.Unix(0, 0))
			f := memlock.NewFactory(memlock.WithClock(c))
			t.Cleanup(func() { f.Close() })
			return func(opts ...lock.Option) lock.Locker { return f.AsLocker(opts...) }, c.Advance
		},
	})
}

func TestManualClockExpiresLease(t *testing.T) {
	clock := memlock.NewManualClock(time.Unix(0, 0))
	f := memlock.NewFactory(memlock.WithClock(clock), memlock.WithTTL(time.Minute), memlock.WithAutoRenew(false))
	ctx := context.Background()
	h, err := f.Acquire(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	clock.Advance(59 * time.Second)
	if h.Err() != nil {
		t.Fatal("lease ended before its TTL")
	}
	if err := h.Extend(ctx); err != nil {
		t.Fatal(err)
	}
	clock.Advance(59 * time.Second)
	if h.Err() != nil {
		t.Fatal("extended lease ended early")
	}
	clock.Advance(time.Second)
	<-h.Done()
	if !errors.Is(h.Err(), memlock.ErrLockLost) {
		t.Fatalf("Err = %v", h.Err())
	}
	if err := h.Extend(ctx); !errors.Is(err, lock.ErrLockLost) {
		t.Fatalf("Extend after expiry = %v", err)
	}
	h2, err := f.Acquire(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Release(); !errors.Is(err, memlock.ErrLockLost) {
		t.Fatalf("late Release = %v", err)
	}
	if _, err := f.Acquire(ctx, "job"); !errors.Is(err, memlock.ErrLocked) {
		t.Fatalf("late Release freed the successor: %v", err)
	}
	h2.Release()
}

func TestForceLossCancelsWithLock(t *testing.T) {
	f := memlock.NewFactory()
	err := f.WithLock(context.Background(), "w", func(ctx context.Context) error {
		if n := f.ForceLoss("w"); n != 1 {
			t.Errorf("ForceLoss = %d", n)
		}
		<-ctx.Done()
		return ctx.Err()
	})
	if !errors.Is(err, memlock.ErrLockLost) || !errors.Is(err, context.Canceled) {
		t.Fatalf("WithLock = %v", err)
	}
}

func BenchmarkAcquireRelease(b *testing.B) {
	f := memlock.NewFactory(memlock.WithLogger(nil))
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		h, err := f.Acquire(ctx, "bench")
		if err != nil {
			b.Fatal(err)
		}
		h.Release()
	}
}

// BenchmarkHandoff measures the time from one goroutine's Release to the
// waiting goroutine's Acquire returning.
func BenchmarkHandoff(b *testing.B) {
	f := memlock.NewFactory(memlock.WithLogger(nil))
	ctx := context.Background()
	h, _ := f.Acquire(ctx, "pp")
	var total time.Duration
	for i := 0; i < b.N; i++ {
		got := make(chan *memlock.Holder)
		go func() {
			w, err := f.Acquire(ctx, "pp", memlock.WithWait())
			if err != nil {
				b.Error(err)
			}
			got <- w
		}()
		testenv.Eventually(b, 10*time.Second, "the waiter queued", func() bool { return f.Waiting("pp") > 0 })
		start := time.Now()
		h.Release()
		h = <-got
		total += time.Since(start)
	}
	h.Release()
	b.ReportMetric(float64(total.Nanoseconds())/float64(b.N), "ns/handoff")
}
