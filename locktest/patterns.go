package locktest

// RunFence and RunLedger check implementations of lock.Fence and
// lock.Ledger, as Run checks lockers: a durable store (a Postgres table, a
// Redis script, etcd, files) calls them from its tests with a constructor for
// clients of one shared store.

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ubgo/lock"
)

// NewFence returns a client of the store under test. Clients from two calls
// must share the store the way two processes would.
type NewFence func(t testing.TB) lock.Fence

// NewLedger returns a client of the store under test, like NewFence.
type NewLedger func(t testing.TB) lock.Ledger

// prefix makes keys unique to this run, so state left in a shared server
// by earlier runs cannot interfere.
func prefix(t testing.TB) string {
	return fmt.Sprintf("locktest/%x/%s/", time.Now().UnixNano(), t.Name())
}

// RunFence checks that the fence accepts a token only when it is at least
// the highest accepted for its key, atomically, across clients, over the
// whole uint64 range.
func RunFence(t *testing.T, newFence NewFence) {
	t.Run("Order", func(t *testing.T) {
		f, other := newFence(t), newFence(t)
		k := prefix(t) + "k"
		for i, s := range []struct {
			f     lock.Fence
			token uint64
			ok    bool
		}{
			{f, 0, false},
			{f, 3, true},
			{f, 3, true},
			{other, 2, false}, // seen through another client
			{other, 4, true},
			{f, 3, false},
			{f, 5, true},
		} {
			err := s.f.RejectIfStale(ctxT(t), k, s.token)
			switch {
			case s.ok && err != nil:
				t.Fatalf("step %d: token %d: %v", i, s.token, err)
			case !s.ok && !errors.Is(err, lock.ErrStaleToken):
				t.Fatalf("step %d: token %d: %v, want ErrStaleToken", i, s.token, err)
			case !s.ok && (errors.Is(err, lock.ErrLocked) || errors.Is(err, lock.ErrLockLost)):
				t.Fatalf("step %d: ErrStaleToken must not match lock errors: %v", i, err)
			}
		}
	})
	t.Run("Message", func(t *testing.T) {
		f := newFence(t)
		k := prefix(t) + "k"
		if err := f.RejectIfStale(ctxT(t), k, 42); err != nil {
			t.Fatal(err)
		}
		err := f.RejectIfStale(ctxT(t), k, 1)
		if !errors.Is(err, lock.ErrStaleToken) || !strings.Contains(err.Error(), "token 1 is below 42") {
			t.Errorf("a stale token's error = %v; want it to say %q, the tokens as plain numbers", err, "token 1 is below 42")
		}
	})
	t.Run("Keys", func(t *testing.T) {
		f := newFence(t)
		p := prefix(t)
		// Keys that a careless mapping to storage would let collide.
		keys := []string{p + "a", p + "a/b", p + "a:fence", p + "a.0", p + "A", p + "ünï ☃", p + "a%2Fb"}
		for i, k := range keys {
			if err := f.RejectIfStale(ctxT(t), k, uint64(100-i)); err != nil {
				t.Fatalf("key %q: %v; distinct keys must not share a fence", k, err)
			}
		}
	})
	t.Run("LargeTokens", func(t *testing.T) {
		f := newFence(t)
		k := prefix(t) + "k"
		// 2^53+1 is where doubles (Lua numbers, JSON) stop being exact;
		// 2^63 is where signed 64-bit columns overflow.
		for _, tok := range []uint64{1 << 53, 1<<53 + 1, 1 << 63, 1<<63 + 1, math.MaxUint64} {
			if err := f.RejectIfStale(ctxT(t), k, tok); err != nil {
				t.Fatalf("token %d after a lower one: %v", tok, err)
			}
			if err := f.RejectIfStale(ctxT(t), k, tok-1); !errors.Is(err, lock.ErrStaleToken) {
				t.Fatalf("token %d after %d: %v, want ErrStaleToken", tok-1, tok, err)
			}
		}
	})
	t.Run("Atomic", func(t *testing.T) {
		// A read-then-write implementation lets a lower token overwrite a
		// higher one under concurrency; the highest accepted token is then
		// forgotten, and one just below it gets through.
		k := prefix(t) + "k"
		clients := []lock.Fence{newFence(t), newFence(t)}
		var mu sync.Mutex
		var top uint64
		var wg sync.WaitGroup
		for w := 0; w < 8; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				f := clients[w%2]
				for i := 0; i < 40; i++ {
					tok := uint64(rand.IntN(1000) + 2)
					err := f.RejectIfStale(ctxT(t), k, tok)
					if err != nil && !errors.Is(err, lock.ErrStaleToken) {
						t.Error(err)
						return
					}
					if err == nil {
						mu.Lock()
						top = max(top, tok)
						mu.Unlock()
					}
				}
			}()
		}
		wg.Wait()
		if err := clients[0].RejectIfStale(ctxT(t), k, top-1); !errors.Is(err, lock.ErrStaleToken) {
			t.Fatalf("after %d was accepted, %d got %v: a concurrent lower token overwrote it", top, top-1, err)
		}
		if err := clients[1].RejectIfStale(ctxT(t), k, top); err != nil {
			t.Fatalf("the highest token %d is refused: %v", top, err)
		}
	})
	t.Run("Cancelled", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if err := newFence(t).RejectIfStale(ctx, prefix(t)+"k", 1); err == nil {
			t.Fatal("a call on a cancelled context reported success")
		}
	})
}

// RunLedger checks that the ledger records each key once, first record
// wins, idempotently, and that the record is seen by every client.
func RunLedger(t *testing.T, newLedger NewLedger) {
	t.Run("Record", func(t *testing.T) {
		l, other := newLedger(t), newLedger(t)
		k := prefix(t) + "k"
		if done, err := l.IsDone(ctxT(t), k); done || err != nil {
			t.Fatalf("fresh key: done %v err %v", done, err)
		}
		if err := l.MarkDone(ctxT(t), k, 7); err != nil {
			t.Fatal(err)
		}
		if done, err := other.IsDone(ctxT(t), k); !done || err != nil {
			t.Fatalf("after MarkDone, another client: done %v err %v", done, err)
		}
		if err := other.MarkDone(ctxT(t), k, 9); err != nil {
			t.Fatalf("a second MarkDone must be a no-op, got %v", err)
		}
		if err := l.MarkDone(ctxT(t), prefix(t)+"big", math.MaxUint64); err != nil {
			t.Fatalf("token MaxUint64: %v", err)
		}
	})
	t.Run("Keys", func(t *testing.T) {
		l := newLedger(t)
		p := prefix(t)
		if err := l.MarkDone(ctxT(t), p+"a", 1); err != nil {
			t.Fatal(err)
		}
		for _, k := range []string{p + "a/b", p + "a:done", p + "a.0", p + "A", p + "a ", p + "a@2026-01-01T00:00:00Z"} {
			if done, err := l.IsDone(ctxT(t), k); done || err != nil {
				t.Fatalf("key %q: done %v err %v; only %q was recorded", k, done, err, p+"a")
			}
		}
	})
	t.Run("Concurrent", func(t *testing.T) {
		k := prefix(t) + "k"
		clients := []lock.Ledger{newLedger(t), newLedger(t)}
		var wg sync.WaitGroup
		for w := 0; w < 8; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := clients[w%2].MarkDone(ctxT(t), k, uint64(w+1)); err != nil {
					t.Errorf("concurrent MarkDone: %v", err)
				}
			}()
		}
		wg.Wait()
		if done, err := clients[0].IsDone(ctxT(t), k); !done || err != nil {
			t.Fatalf("done %v err %v", done, err)
		}
	})
	t.Run("Cancelled", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		l := newLedger(t)
		if done, err := l.IsDone(ctx, prefix(t)+"k"); done || err == nil {
			t.Fatalf("Done on a cancelled context: done %v err %v; want an error", done, err)
		}
		if err := l.MarkDone(ctx, prefix(t)+"k", 1); err == nil {
			t.Fatal("MarkDone on a cancelled context reported success")
		}
	})
}

// StaleWriter is the fencing scenario RunStaleWriter plays: holder A writes
// through its fence, stalls, and loses the lock to B without noticing; the
// fence must then refuse A's late write.
type StaleWriter struct {
	Name   string
	A      lock.Holder // holds Name
	FenceA lock.Fence  // A's client of the store
	FenceB lock.Fence  // B's client of the same store
	// TakeOver makes A's lock lapse while A does nothing (its lease left
	// to run out, its session killed) and returns B's holder of Name.
	TakeOver func() (lock.Holder, error)
}

// RunStaleWriter checks fencing end to end: A's write is accepted, B's
// token is above A's and its writes are accepted, and A's late write is
// refused with an error matching lock.ErrStaleToken and no lock error. It
// releases B.
func RunStaleWriter(t *testing.T, ctx context.Context, s StaleWriter) {
	t.Helper()
	if err := s.FenceA.RejectIfStale(ctx, s.Name, s.A.Token()); err != nil {
		t.Fatalf("A's first write: %v", err)
	}
	b, err := s.TakeOver()
	if err != nil {
		t.Fatalf("B's acquire: %v", err)
	}
	defer b.Release()
	if b.Token() <= s.A.Token() {
		t.Fatalf("B's token %d is not above A's %d", b.Token(), s.A.Token())
	}
	if err := s.FenceB.RejectIfStale(ctx, s.Name, b.Token()); err != nil {
		t.Fatalf("B's write: %v", err)
	}
	err = s.FenceA.RejectIfStale(ctx, s.Name, s.A.Token())
	if !errors.Is(err, lock.ErrStaleToken) {
		t.Fatalf("A's late write: %v, want ErrStaleToken", err)
	}
	if errors.Is(err, lock.ErrLocked) || errors.Is(err, lock.ErrLockLost) {
		t.Fatalf("ErrStaleToken must not match lock errors: %v", err)
	}
	if err := s.FenceB.RejectIfStale(ctx, s.Name, b.Token()); err != nil {
		t.Fatalf("B writes again: %v", err)
	}
}

// NewLocker returns a client of the lock store under test whose opts apply
// to every Acquire, like Backend.New.
type NewLocker func(t testing.TB, opts ...lock.Option) lock.Locker

// RunOnceReplicas checks lock.RunOnce across replicas, each with a locker
// from newLocker and a ledger from newLedger of its own, as separate
// processes would have: a replica that starts after the first one finished
// finds the work recorded and does not run it, and a failed run records
// nothing, so the next replica runs it again.
func RunOnceReplicas(t *testing.T, newLocker NewLocker, newLedger NewLedger) {
	t.Run("LateReplica", func(t *testing.T) {
		key := prefix(t) + "migrate"
		runs := 0
		replica := func() (bool, error) {
			return lock.RunOnce(ctxT(t), newLocker(t, lock.WithWait()), newLedger(t), key,
				func(context.Context) error { runs++; return nil })
		}
		if ran, err := replica(); !ran || err != nil {
			t.Fatalf("first replica: ran %v err %v", ran, err)
		}
		if ran, err := replica(); ran || err != nil || runs != 1 {
			t.Fatalf("late replica: ran %v err %v, fn ran %d times", ran, err, runs)
		}
	})
	t.Run("FailedRun", func(t *testing.T) {
		key := prefix(t) + "fails"
		boom := errors.New("boom")
		if ran, err := lock.RunOnce(ctxT(t), newLocker(t), newLedger(t), key, func(context.Context) error { return boom }); !ran || !errors.Is(err, boom) {
			t.Fatalf("failing run: ran %v err %v", ran, err)
		}
		if ran, err := lock.RunOnce(ctxT(t), newLocker(t), newLedger(t), key, func(context.Context) error { return nil }); !ran || err != nil {
			t.Fatalf("the next replica after a failure: ran %v err %v; want it to run", ran, err)
		}
	})
}
