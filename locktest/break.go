package locktest

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ubgo/lock"
)

// A Breaker frees a name whoever holds it: an operator's tool for a holder
// that is gone (a crashed or frozen process) while its lease or stale
// window still runs. filelock, redislock and etcdlock have one.
//
// Break raises the fence record of the key equal to name (on the store and
// prefix of the lock) above every freed holder's token before it frees the
// name, leaves a record that is higher already as it is, and frees every
// holder of the name (a mutex's, a semaphore's permits, the readers of a
// name held shared) but no waiter; the next holder's token is larger than
// every freed one. A freed holder that is alive learns of it by itself,
// within Backend.LossBound, or at once when it calls Extend: Done closes
// and Err matches ErrLockLost and lock.ErrRemoved. Break returns an error matching lock.ErrNotHeld when
// nothing holds name, and lock.ErrInvalidName for a bad name.
type Breaker interface {
	Break(ctx context.Context, name string) error
}

// breakLock runs the checks of a Breaker, on each kind of lock the backend
// claims.
func (s *suite) breakLock(t *testing.T) {
	if s.Breaker == nil {
		t.Skip("backend gave no Breaker")
	}
	t.Run("Mutex", s.breakMutex)
	t.Run("Semaphore", s.breakSemaphore)
	t.Run("Shared", s.breakShared)
	t.Run("Free", s.breakFree)
}

// mustBreak breaks name, failing t on an error.
func (s *suite) mustBreak(t testing.TB, name string) {
	t.Helper()
	if err := s.Breaker(t).Break(ctxT(t), name); err != nil {
		t.Fatalf("Break(%q): %v", name, err)
	}
}

// fenced checks that the fence of name, if the backend gave one, accepts
// the tokens of ok and rejects those of stale.
func (s *suite) fenced(t testing.TB, when, name string, ok, stale []lock.Holder) {
	t.Helper()
	if s.Fence == nil {
		return
	}
	f := s.Fence(t)
	for _, h := range stale {
		if err := f.RejectIfStale(ctxT(t), name, h.Token()); !errors.Is(err, lock.ErrStaleToken) {
			t.Errorf("fence %s, a broken holder's token %d: %v; want ErrStaleToken", when, h.Token(), err)
		}
	}
	for _, h := range ok {
		if err := f.RejectIfStale(ctxT(t), name, h.Token()); err != nil {
			t.Errorf("fence %s, token %d: %v; want it accepted", when, h.Token(), err)
		}
	}
}

// broken checks what a holder freed by Break sees: Done closes (by itself
// within LossBound, the backend's watch, renewal or read-back finding the
// lock gone; else at once after an Extend, which must report the loss),
// Err says it was removed, and Extend and Release report the loss.
func (s *suite) broken(t testing.TB, what string, h lock.Holder, byItself bool) {
	t.Helper()
	e, extends := h.(lock.Extender)
	extends = extends && s.Extend
	if extends && !byItself {
		if err := e.Extend(ctxT(t)); !errors.Is(err, lock.ErrLockLost) {
			t.Errorf("%s: Extend after the break = %v; want ErrLockLost", what, err)
		}
	}
	eventually(t, h.Done(), s.LossBound, what+": Done after the break")
	err := h.Err()
	if !errors.Is(err, s.ErrLockLost) || !errors.Is(err, lock.ErrLockLost) || lock.ReasonOf(err) != lock.ReasonRemoved {
		t.Errorf("%s: Err after the break = %v; want the backend's ErrLockLost, wrapping lock.ErrRemoved", what, err)
	}
	if extends && byItself {
		if err := e.Extend(ctxT(t)); !errors.Is(err, lock.ErrLockLost) {
			t.Errorf("%s: Extend after the break = %v; want ErrLockLost", what, err)
		}
	}
	if err := h.Release(); !errors.Is(err, s.ErrLockLost) {
		t.Errorf("%s: Release after the break = %v; want ErrLockLost", what, err)
	}
}

// heldBy checks, if the backend gave an Inspector, that name is held by
// exactly the holders hs.
func (s *suite) heldBy(t testing.TB, when, name string, hs ...lock.Holder) {
	t.Helper()
	if s.Inspector == nil {
		return
	}
	info, err := s.Inspector(t).Inspect(ctxT(t), name)
	want := map[uint64]bool{}
	for _, h := range hs {
		want[h.Token()] = true
	}
	ok := err == nil && len(info.Holders) == len(hs)
	for _, ho := range info.Holders {
		ok = ok && want[ho.Token]
	}
	if !ok {
		t.Errorf("Inspect %s = %+v, %v; want %d holders, with the tokens %v", when, info, err, len(hs), want)
	}
}

// granted returns what the first of cs to deliver delivered, and the
// others, failing t on an error or after LossBound: a waiter is woken by
// the break as by a release, or else finds the name free as it would find
// a lost lock's.
func (s *suite) granted(t testing.TB, what string, cs []<-chan got) (got, []<-chan got) {
	t.Helper()
	cases := []reflect.SelectCase{{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(time.After(s.LossBound))}}
	for _, c := range cs {
		cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(c)})
	}
	i, v, _ := reflect.Select(cases)
	if i == 0 {
		t.Fatalf("%s: no lock within %v", what, s.LossBound)
	}
	g := v.Interface().(got)
	if g.err != nil {
		t.Fatalf("%s: %v", what, g.err)
	}
	return g, slices.Delete(slices.Clone(cs), i-1, i)
}

// breakMutex: Break frees a mutex whose holder is alive (as a frozen one
// would look): the fence rejects the old token at once, one of two
// waiters gets the lock with a larger token while the other keeps
// waiting, the old holder learns of it, its late Release leaves the
// successor alone, and the other waiter follows in turn.
func (s *suite) breakMutex(t *testing.T) {
	name := s.name(t, "x")
	ctx := ctxT(t)
	h := s.mustAcquire(t, s.New(t), name)
	s.fenced(t, "before the break", name, []lock.Holder{h}, nil)
	var brk atomic.Bool
	var waiters []<-chan got
	if s.Wait {
		for i := range 2 {
			waiters = append(waiters, waitFor(ctx, s.New(t, lock.WithWait()), name, &brk))
			s.waitQueued(t, name, i+1)
		}
	}
	brk.Store(true)
	s.mustBreak(t, name)
	s.fenced(t, "after the break", name, nil, []lock.Holder{h})
	var w got
	if s.Wait {
		w, waiters = s.granted(t, "a waiter after the break", waiters)
		if !w.after {
			t.Fatal("a waiter got the lock before the break")
		}
	} else {
		w.h = s.mustAcquire(t, s.New(t), name)
	}
	if w.h.Token() <= h.Token() {
		t.Errorf("successor's token %d not above the broken holder's %d", w.h.Token(), h.Token())
	}
	s.fenced(t, "after the break", name, []lock.Holder{w.h}, nil)
	s.broken(t, "the broken holder", h, true)
	s.mustBeLocked(t, s.New(t), name)
	s.heldBy(t, "after the broken holder's Release", name, w.h)
	for _, c := range waiters {
		select {
		case g := <-c:
			t.Fatalf("the second waiter got the lock (%v) while the first held it", g.err)
		default:
		}
	}
	s.mustRelease(t, w.h)
	if len(waiters) > 0 {
		w2, _ := s.granted(t, "the second waiter after the first released", waiters)
		if w2.h.Token() <= w.h.Token() {
			t.Errorf("second waiter's token %d not above the first's %d", w2.h.Token(), w.h.Token())
		}
		s.mustRelease(t, w2.h)
	}
}

// breakSemaphore: Break frees every permit of a semaphore and no waiter;
// the waiter then takes a permit with a token above them all.
func (s *suite) breakSemaphore(t *testing.T) {
	if !s.Semaphore {
		t.Skip("backend does not claim WithMaxConcurrent")
	}
	const n = 3
	name := s.name(t, "x")
	ctx := ctxT(t)
	sem := lock.WithMaxConcurrent(n)
	var hs []lock.Holder
	for range n {
		hs = append(hs, s.mustAcquire(t, s.New(t, sem), name))
	}
	if h, err := s.New(t, sem).Acquire(ctx, name); !errors.Is(err, lock.ErrLocked) {
		if err == nil {
			h.Release()
		}
		t.Fatalf("permit %d of %d: %v; want ErrLocked", n+1, n, err)
	}
	var brk atomic.Bool
	var waiter <-chan got
	if s.Wait {
		waiter = waitFor(ctx, s.New(t, sem, lock.WithWait()), name, &brk)
		s.waitQueued(t, name, 1)
	}
	brk.Store(true)
	s.breakAll(t, name, "permit", hs, waiter, sem)
}

// breakShared: Break frees every reader of a name held shared; a writer
// waiting for them gets the name with a token above theirs, and each
// reader learns it lost the lock.
func (s *suite) breakShared(t *testing.T) {
	if !s.Shared {
		t.Skip("backend does not claim WithShared")
	}
	name := s.name(t, "x")
	ctx := ctxT(t)
	var rs []lock.Holder
	for range 3 {
		rs = append(rs, s.mustAcquire(t, s.New(t, lock.WithShared()), name))
	}
	s.heldBy(t, "of three readers", name, rs...)
	var brk atomic.Bool
	var writer <-chan got
	if s.Wait {
		writer = waitFor(ctx, s.New(t, lock.WithWait()), name, &brk)
		s.waitQueued(t, name, 1)
	}
	brk.Store(true)
	s.breakAll(t, name, "reader", rs, writer)
}

// breakAll breaks name, held by hs (each a what), and checks what follows:
// the fence refuses their tokens, the next holder — waiting, or a new
// Acquire with opts where the backend does not wait — gets the name with a
// token above theirs, and each of hs learns it lost the lock.
func (s *suite) breakAll(t *testing.T, name, what string, hs []lock.Holder, waiter <-chan got, opts ...lock.Option) {
	s.mustBreak(t, name)
	s.fenced(t, "after the break", name, nil, hs)
	var w got
	if s.Wait {
		w, _ = s.granted(t, "the waiter after the break", []<-chan got{waiter})
	} else {
		w.h = s.mustAcquire(t, s.New(t, opts...), name)
	}
	defer s.mustRelease(t, w.h)
	for i, h := range hs {
		if w.h.Token() <= h.Token() {
			t.Errorf("new holder's token %d not above broken %s %d's %d", w.h.Token(), what, i, h.Token())
		}
		s.broken(t, fmt.Sprintf("broken %s %d", what, i), h, false)
	}
	s.heldBy(t, "after the break and one acquire", name, w.h)
}

// breakFree: Break of a name nobody holds (never held, or released) says
// so; a bad name is ErrInvalidName; a fence record above the freed token
// stays as it is.
func (s *suite) breakFree(t *testing.T) {
	br := s.Breaker(t)
	ctx := ctxT(t)
	name := s.name(t, "x")
	if err := br.Break(ctx, name); !errors.Is(err, lock.ErrNotHeld) || !strings.HasPrefix(err.Error(), s.prefix()) {
		t.Errorf("Break of a name never held = %v; want ErrNotHeld, said as %q + detail", err, s.prefix())
	}
	s.mustRelease(t, s.mustAcquire(t, s.New(t), name))
	if err := br.Break(ctx, name); !errors.Is(err, lock.ErrNotHeld) {
		t.Errorf("Break of a released name = %v; want ErrNotHeld", err)
	}
	if err := br.Break(ctx, ""); !errors.Is(err, lock.ErrInvalidName) {
		t.Errorf("Break(\"\") = %v; want ErrInvalidName", err)
	}
	if s.Fence == nil {
		return
	}
	f := s.Fence(t)
	h := s.mustAcquire(t, s.New(t), name)
	const high = 1 << 62
	if err := f.RejectIfStale(ctx, name, high); err != nil {
		t.Fatal(err)
	}
	s.mustBreak(t, name)
	if err := f.RejectIfStale(ctx, name, high-1); !errors.Is(err, lock.ErrStaleToken) {
		t.Errorf("fence after the break, token %d = %v; want the record kept at %d", uint64(high-1), err, uint64(high))
	}
	if err := f.RejectIfStale(ctx, name, high); err != nil {
		t.Errorf("fence after the break, token %d = %v; want the record kept at %d", uint64(high), err, uint64(high))
	}
	s.broken(t, "the broken holder", h, false)
}
