//go:build unix

package filelock_test

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/filelock"
)

// Break frees a mutex whose holder is alive (as a frozen one would look):
// the fence under the name rejects the old token at once, a waiter gets
// the lock with a larger token, and the old holder learns of it when it
// reads its marker back, and its Release leaves the successor alone.
func TestBreakMutex(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	opts := []filelock.Option{filelock.WithDir(dir), filelock.WithLogger(nil), filelock.WithStaleAfter(time.Minute)}
	name := "jobs/nightly"
	h := mustAcquire(t, newFactory(t, opts...), name)
	fence := filelock.NewFence(opts...)
	if err := fence.RejectIfStale(ctx, name, h.Token()); err != nil {
		t.Fatalf("fence before the break: %v", err)
	}
	got := make(chan *filelock.Holder, 1)
	errc := make(chan error, 1)
	go func() {
		w, err := newFactory(t, opts...).Acquire(ctx, name, filelock.WithWait())
		if err != nil {
			errc <- err
			return
		}
		got <- w
	}()

	if err := newFactory(t, opts...).Break(ctx, name); err != nil {
		t.Fatalf("Break: %v", err)
	}
	if err := fence.RejectIfStale(ctx, name, h.Token()); !errors.Is(err, lock.ErrStaleToken) {
		t.Errorf("fence after the break, old token: %v, want ErrStaleToken", err)
	}
	var w *filelock.Holder
	select {
	case w = <-got:
	case err := <-errc:
		t.Fatalf("waiter: %v", err)
	case <-time.After(30 * time.Second): // half the stale window: the break freed it
		t.Fatal("waiter did not get the lock after the break")
	}
	defer w.Release()
	if w.Token() <= h.Token() {
		t.Errorf("successor's token %d, not above the broken holder's %d", w.Token(), h.Token())
	}
	if err := fence.RejectIfStale(ctx, name, w.Token()); err != nil {
		t.Errorf("fence, successor's token: %v", err)
	}
	select {
	case <-h.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("the broken holder's Done did not close")
	}
	if !errors.Is(h.Err(), filelock.ErrLockLost) {
		t.Errorf("broken holder's Err: %v, want ErrLockLost", h.Err())
	}
	if err := h.Release(); !errors.Is(err, filelock.ErrLockLost) {
		t.Errorf("broken holder's Release: %v, want ErrLockLost", err)
	}
	info, err := newFactory(t, opts...).Inspect(ctx, name)
	if err != nil || len(info.Holders) != 1 || info.Holders[0].Token != w.Token() {
		t.Errorf("after the old holder's Release: %+v, %v; want the successor holding it", info, err)
	}
}

// Break frees every permit of a semaphore; the next permit's token is
// above them all.
func TestBreakSemaphore(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	opts := []filelock.Option{filelock.WithDir(dir), filelock.WithLogger(nil), filelock.WithMaxConcurrent(3)}
	f := newFactory(t, opts...)
	var hs []*filelock.Holder
	for range 3 {
		hs = append(hs, mustAcquire(t, f, "pool"))
	}
	mustLocked(t, f, "pool")
	if err := newFactory(t, opts...).Break(ctx, "pool"); err != nil {
		t.Fatalf("Break: %v", err)
	}
	n := mustAcquire(t, f, "pool")
	defer n.Release()
	for i, h := range hs {
		if n.Token() <= h.Token() {
			t.Errorf("new permit's token %d, not above broken permit %d's %d", n.Token(), i, h.Token())
		}
		if err := h.Extend(ctx); !errors.Is(err, filelock.ErrLockLost) {
			t.Errorf("broken permit %d: Extend %v, want ErrLockLost", i, err)
		}
	}
	if info, err := f.Inspect(ctx, "pool"); err != nil || len(info.Holders) != 1 {
		t.Errorf("after the break and one acquire: %+v, %v; want one holder", info, err)
	}
}

// Break of a free name says so and writes no fence record; a bad name is
// ErrInvalidName; a fence record above the freed tokens stays.
func TestBreakFreeAndFence(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	opts := []filelock.Option{filelock.WithDir(dir), filelock.WithLogger(nil)}
	f := newFactory(t, opts...)
	fence := filelock.NewFence(opts...)
	if err := f.Break(ctx, "free"); !errors.Is(err, lock.ErrNotHeld) {
		t.Errorf("Break of a free name: %v, want ErrNotHeld", err)
	}
	if _, err := os.Stat(fence.Path("free")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Break of a free name wrote the fence record: %v", err)
	}
	if err := f.Break(ctx, ""); !errors.Is(err, lock.ErrInvalidName) {
		t.Errorf("Break(\"\"): %v, want ErrInvalidName", err)
	}
	h := mustAcquire(t, f, "x")
	const high = 1 << 62
	if err := fence.RejectIfStale(ctx, "x", high); err != nil {
		t.Fatal(err)
	}
	if err := f.Break(ctx, "x"); err != nil {
		t.Fatalf("Break: %v", err)
	}
	if err := fence.RejectIfStale(ctx, "x", high-1); !errors.Is(err, lock.ErrStaleToken) {
		t.Errorf("fence after the break: %v; want the record kept at %d", err, uint64(high))
	}
	if err := fence.RejectIfStale(ctx, "x", high); err != nil {
		t.Errorf("fence after the break: %v; want the record kept at %d", err, uint64(high))
	}
	if err := h.Extend(ctx); !errors.Is(err, filelock.ErrLockLost) {
		t.Errorf("Extend after the break: %v", err)
	}
}

// Break frees every shared holder of a name; Inspect reports each of them
// before, the fence rejects their tokens after, each learns it lost the
// lock, and a writer takes the name with a larger token.
func TestBreakShared(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	opts := []filelock.Option{filelock.WithDir(dir), filelock.WithLogger(nil), filelock.WithStaleAfter(time.Minute)}
	name := "schema"
	var rs []*filelock.Holder
	for range 3 {
		rs = append(rs, mustAcquire(t, newFactory(t, opts...), name, filelock.WithShared()))
	}
	f := newFactory(t, opts...)
	info, err := f.Inspect(ctx, name)
	if err != nil || len(info.Holders) != 3 {
		t.Fatalf("Inspect of three readers: %+v, %v", info, err)
	}
	mustLocked(t, f, name)
	if err := f.Break(ctx, name); err != nil {
		t.Fatalf("Break: %v", err)
	}
	fence := filelock.NewFence(opts...)
	w := mustAcquire(t, f, name)
	defer w.Release()
	for i, r := range rs {
		if err := fence.RejectIfStale(ctx, name, r.Token()); !errors.Is(err, lock.ErrStaleToken) {
			t.Errorf("fence after the break, reader %d's token: %v, want ErrStaleToken", i, err)
		}
		if w.Token() <= r.Token() {
			t.Errorf("writer's token %d, not above reader %d's %d", w.Token(), i, r.Token())
		}
		select {
		case <-r.Done():
		case <-time.After(30 * time.Second):
			t.Fatalf("broken reader %d's Done did not close", i)
		}
		if err := r.Release(); !errors.Is(err, filelock.ErrLockLost) {
			t.Errorf("broken reader %d's Release: %v, want ErrLockLost", i, err)
		}
	}
	info, err = f.Inspect(ctx, name)
	if err != nil || len(info.Holders) != 1 || info.Holders[0].Token != w.Token() {
		t.Errorf("after the readers' Release: %+v, %v; want the writer holding it", info, err)
	}
}
