//go:build unix

package filelock_test

import (
	"context"
	"testing"
	"time"

	"github.com/ubgo/lock/filelock"
	"github.com/ubgo/lock/internal/testenv"
)

// The waiters of one process take a name in the order they came, and a
// holder that releases and asks again at once queues behind them instead
// of taking the name back (which the guard, free at once, would let it do).
func TestWaitersOfAProcessInOrder(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	newFactory := func() *filelock.Factory {
		f := filelock.NewFactory(filelock.WithDir(dir), filelock.WithLogger(nil), filelock.WithWait())
		t.Cleanup(func() { f.Close() })
		return f
	}
	holder := newFactory()
	h, err := holder.Acquire(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	type got struct {
		who   int
		token uint64
	}
	order := make(chan got, 3)
	for who := 1; who <= 2; who++ {
		f := newFactory()
		go func() {
			w, err := f.Acquire(ctx, "x")
			if err != nil {
				t.Error(err)
				return
			}
			order <- got{who, w.Token()}
			w.Release()
		}()
		testenv.Eventually(t, 30*time.Second, "a waiter waits", func() bool { return filelock.Waiting(dir, "x") == who })
	}
	h.Release()
	again, err := holder.Acquire(ctx, "x") // queues behind both
	if err != nil {
		t.Fatal(err)
	}
	order <- got{0, again.Token()}
	again.Release()
	prev := h.Token()
	for i, want := range []int{1, 2, 0} {
		g := <-order
		if g.who != want || g.token <= prev {
			t.Fatalf("acquisition %d: waiter %d with token %d (after %d); want waiter %d (0: the holder again) with a larger token", i+1, g.who, g.token, prev, want)
		}
		prev = g.token
	}
}
