package lock_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/ubgo/lock"
)

func TestMemoryFence(t *testing.T) {
	ctx := context.Background()
	f := lock.NewMemoryFence()
	steps := []struct {
		key   string
		token uint64
		ok    bool
	}{
		{"a", 0, false}, // no holder has token 0
		{"a", 3, true},
		{"a", 3, true}, // the same holder writes again
		{"a", 2, false},
		{"a", 5, true},
		{"a", 4, false},
		{"b", 1, true}, // keys are independent
		{"a", 1, false},
	}
	for i, s := range steps {
		err := f.RejectIfStale(ctx, s.key, s.token)
		if s.ok && err != nil {
			t.Fatalf("step %d: RejectIfStale(%q, %d) = %v", i, s.key, s.token, err)
		}
		if !s.ok && !errors.Is(err, lock.ErrStaleToken) {
			t.Fatalf("step %d: RejectIfStale(%q, %d) = %v, want ErrStaleToken", i, s.key, s.token, err)
		}
	}
	if f.Highest("a") != 5 || f.Highest("b") != 1 || f.Highest("c") != 0 {
		t.Fatalf("highest a=%d b=%d c=%d", f.Highest("a"), f.Highest("b"), f.Highest("c"))
	}
	err := f.RejectIfStale(ctx, "a", 4)
	if errors.Is(err, lock.ErrLocked) || errors.Is(err, lock.ErrLockLost) {
		t.Fatalf("ErrStaleToken must wrap nothing: %v", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := f.RejectIfStale(cctx, "a", 9); !errors.Is(err, context.Canceled) || f.Highest("a") != 5 {
		t.Fatalf("cancelled call = %v, highest %d", err, f.Highest("a"))
	}
}

// TestMemoryFenceApply: with check and write in one step, the writes that
// land never go back in token order, however writers interleave.
func TestMemoryFenceApply(t *testing.T) {
	ctx := context.Background()
	f := lock.NewMemoryFence()
	var landed []uint64 // guarded by the fence itself
	var wg sync.WaitGroup
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 200; i++ {
				token := uint64(rand.IntN(100) + 1)
				err := f.Apply(ctx, "obj", token, func() error {
					landed = append(landed, token)
					return nil
				})
				if err != nil && !errors.Is(err, lock.ErrStaleToken) {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	for i := 1; i < len(landed); i++ {
		if landed[i] < landed[i-1] {
			t.Fatalf("write with token %d landed after %d", landed[i], landed[i-1])
		}
	}
	if len(landed) == 0 || landed[len(landed)-1] != f.Highest("obj") {
		t.Fatalf("last write %v, highest %d", landed, f.Highest("obj"))
	}

	boom := errors.New("write failed")
	if err := f.Apply(ctx, "w", 7, func() error { return boom }); err != boom {
		t.Fatalf("Apply = %v, want the write's error", err)
	}
	if f.Highest("w") != 7 {
		t.Fatal("a failed write did not raise the bar; a lower token could still write")
	}
	ran := false
	if err := f.Apply(ctx, "w", 6, func() error { ran = true; return nil }); ran || !errors.Is(err, lock.ErrStaleToken) {
		t.Fatalf("stale Apply ran %v, err %v", ran, err)
	}
}

// TestFenceStaleHolder is scenario 7: A pauses past its lease, B takes over
// and writes, A wakes and its write is refused.
func TestFenceStaleHolder(t *testing.T) {
	ctx := context.Background()
	s := newToyStore()
	fence := lock.NewMemoryFence()
	store := map[string]string{}
	put := func(token uint64, data string) error {
		return fence.Apply(ctx, "payments/today.csv", token, func() error {
			store["payments/today.csv"] = data
			return nil
		})
	}
	a, _ := s.locker("a").Acquire(ctx, "payments-export")
	s.crash("payments-export") // A's GC pause outlives its lease
	b, err := s.locker("b").Acquire(ctx, "payments-export")
	if err != nil {
		t.Fatal(err)
	}
	if err := put(b.Token(), "from B"); err != nil {
		t.Fatal(err)
	}
	if err := put(a.Token(), "from A"); !errors.Is(err, lock.ErrStaleToken) {
		t.Fatalf("A's stale write = %v", err)
	}
	if store["payments/today.csv"] != "from B" {
		t.Fatalf("stored %q", store["payments/today.csv"])
	}
}

func ExampleMemoryFence() {
	ctx := context.Background()
	fence := lock.NewMemoryFence()                     // in production: a table or a Redis script
	fmt.Println(fence.RejectIfStale(ctx, "report", 7)) // the current holder writes
	err := fence.RejectIfStale(ctx, "report", 6)       // a holder that lost its lock wakes up
	fmt.Println(errors.Is(err, lock.ErrStaleToken))
	// Output:
	// <nil>
	// true
}
