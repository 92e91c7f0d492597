package gocronlock_test

import (
	"context"
	"testing"

	"github.com/ubgo/lock/contrib/gocronlock"
	"github.com/ubgo/lock/memlock"
)

// BenchmarkLockUnlock is the adapter's cost per run (Lock then Unlock,
// without a minimum hold so the release happens inside the loop), beside
// BenchmarkFloor, the backend's own Acquire and Release of the same name.
func BenchmarkLockUnlock(b *testing.B) {
	f := memlock.NewFactory(memlock.WithLogger(nil))
	defer f.Close()
	l := gocronlock.New(f.AsLocker(), gocronlock.WithMinHold(0))
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		lk, err := l.Lock(ctx, "job")
		if err != nil {
			b.Fatal(err)
		}
		if err := lk.Unlock(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkLockUnlockTicks adds the per-tick lock.
func BenchmarkLockUnlockTicks(b *testing.B) {
	f := memlock.NewFactory(memlock.WithLogger(nil))
	defer f.Close()
	l := gocronlock.New(f.AsLocker(), gocronlock.WithMinHold(0), gocronlock.WithTickResolution(1))
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		lk, err := l.Lock(ctx, "job")
		if err != nil {
			b.Fatal(err)
		}
		if err := lk.Unlock(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkFloor(b *testing.B) {
	f := memlock.NewFactory(memlock.WithLogger(nil))
	defer f.Close()
	lk := f.AsLocker()
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		h, err := lk.Acquire(ctx, "gocron:job")
		if err != nil {
			b.Fatal(err)
		}
		if err := h.Release(); err != nil {
			b.Fatal(err)
		}
	}
}
