package locktest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ubgo/lock"
)

// isMaxHold fails t unless err is the end of a WithMaxHold.
func (s *suite) isMaxHold(t testing.TB, what string, err error) {
	t.Helper()
	if !errors.Is(err, lock.ErrMaxHold) || !errors.Is(err, lock.ErrLockLost) || !errors.Is(err, s.ErrLockLost) {
		t.Fatalf("%s = %v; want an error matching lock.ErrMaxHold, lock.ErrLockLost and the backend's ErrLockLost", what, err)
	}
}

// maxHold: by real time, WithMaxHold ends a lock d after its Acquire
// however it is renewed (the backend's own renewal, KeepAlive): Done
// closes with ErrMaxHold, WithLock's context is cancelled with it as the
// cause, and the lock is released — another client takes the name, and
// a late Release frees nothing.
func (s *suite) maxHold(t *testing.T) {
	const d = 300 * time.Millisecond
	ended := func(t *testing.T, name string, h lock.Holder) {
		t.Helper()
		s.isMaxHold(t, "Err after WithMaxHold", h.Err())
		h2 := s.acquireWithin(t, name, s.LossBound)
		if h2.Token() <= h.Token() {
			t.Errorf("token after WithMaxHold %d not above %d", h2.Token(), h.Token())
		}
		if err := h.Release(); !errors.Is(err, lock.ErrLockLost) {
			t.Errorf("Release after WithMaxHold = %v; want ErrLockLost", err)
		}
		s.mustBeLocked(t, s.New(t), name)
		s.mustRelease(t, h2)
	}
	cases := []struct {
		what string
		opts []lock.Option
	}{{"WithLock", []lock.Option{lock.WithMaxHold(d)}}}
	if s.TTL > 0 {
		// A lease far longer than the time the name has to be free in:
		// only a release at d frees it in time.
		cases = append(cases, struct {
			what string
			opts []lock.Option
		}{"LongLease", []lock.Option{lock.WithTTL(100 * s.LossBound), lock.WithMaxHold(d)}})
	}
	for _, c := range cases {
		t.Run(c.what, func(t *testing.T) {
			name := s.name(t, "x")
			var h lock.Holder
			err := lock.WithLock(ctxT(t), backendSpy(s.New(t, c.opts...), &h), name, func(ctx context.Context) error {
				select {
				case <-ctx.Done():
					if cause := context.Cause(ctx); !errors.Is(cause, lock.ErrMaxHold) || !errors.Is(cause, s.ErrLockLost) {
						t.Errorf("WithLock's context cause = %v; want ErrMaxHold", cause)
					}
				case <-time.After(d + s.LossBound):
					t.Errorf("WithLock's context not cancelled %v after an Acquire WithMaxHold(%v)", d+s.LossBound, d)
				}
				return nil
			})
			s.isMaxHold(t, "WithLock's error", err)
			ended(t, name, h)
		})
	}
	t.Run("KeepAlive", func(t *testing.T) {
		if !s.Extend || s.TTL == 0 {
			t.Skip("backend claims no Extend and test TTL")
		}
		// Renewed only by KeepAlive, for longer than a TTL: the bound
		// stops it, not the lease.
		hold := 2 * s.TTL
		name := s.name(t, "x")
		h := s.mustAcquire(t, s.New(t, lock.WithTTL(s.TTL), lock.WithAutoRenew(false), lock.WithMaxHold(hold)), name)
		ctx, stop := lock.KeepAlive(ctxT(t), h, s.TTL/3)
		defer stop()
		eventually(t, ctx.Done(), hold+s.LossBound, "KeepAlive's context ending at WithMaxHold")
		s.isMaxHold(t, "KeepAlive's context cause", context.Cause(ctx))
		ended(t, name, h)
	})
}

// maxHoldClock: by the backend's own clock (Backend.Clock), a lock is
// held until its WithMaxHold to the tick, then ends and passes on; an
// Extend by hand does not stretch the bound.
func (s *suite) maxHoldClock(t *testing.T) {
	if s.Clock == nil {
		t.Skip("backend gave no Clock")
	}
	newLocker, advance := s.Clock(t)
	name := s.name(t, "x")
	h := s.mustAcquire(t, newLocker(lock.WithMaxHold(time.Minute)), name)
	advance(time.Minute - time.Millisecond)
	if closed(h.Done()) {
		t.Fatalf("lock ended before its WithMaxHold: %v", h.Err())
	}
	s.mustBeLocked(t, newLocker(), name)
	advance(time.Millisecond)
	eventually(t, h.Done(), s.LossBound, "a lock ending at its WithMaxHold")
	s.isMaxHold(t, "Err after WithMaxHold", h.Err())
	h2 := takeWithin(t, func() lock.Locker { return newLocker() }, name, s.LossBound)
	if err := h.Release(); !errors.Is(err, lock.ErrLockLost) {
		t.Errorf("Release after WithMaxHold = %v; want ErrLockLost", err)
	}
	s.mustBeLocked(t, newLocker(), name)
	s.mustRelease(t, h2)

	if !s.Extend || s.TTL == 0 {
		return
	}
	h = s.mustAcquire(t, newLocker(lock.WithTTL(time.Minute), lock.WithAutoRenew(false), lock.WithMaxHold(90*time.Second)), name)
	advance(50 * time.Second)
	if err := h.(lock.Extender).Extend(ctxT(t)); err != nil {
		t.Fatalf("Extend within WithMaxHold: %v", err)
	}
	advance(40 * time.Second) // the lease runs until 110s, the bound ends it at 90s
	eventually(t, h.Done(), s.LossBound, "an extended lock ending at its WithMaxHold")
	s.isMaxHold(t, "Err after WithMaxHold", h.Err())
	if err := h.(lock.Extender).Extend(ctxT(t)); !errors.Is(err, lock.ErrLockLost) {
		t.Fatalf("Extend after WithMaxHold = %v; want ErrLockLost", err)
	}
	s.mustRelease(t, takeWithin(t, func() lock.Locker { return newLocker() }, name, s.LossBound))
}

// acquireAll: AcquireAll holds every name of the set, each with its own
// token, until Release frees them all.
func (s *suite) acquireAll(t *testing.T) {
	a, b, c := s.name(t, "a"), s.name(t, "b"), s.name(t, "c")
	m, err := lock.AcquireAll(ctxT(t), s.New(t), c, a, b, a)
	if err != nil {
		t.Fatalf("AcquireAll: %v", err)
	}
	for _, name := range []string{a, b, c} {
		if h := m.Member(name); h == nil || h.Token() == 0 {
			t.Fatalf("Member(%q) = %v", name, h)
		}
		s.mustBeLocked(t, s.New(t), name)
	}
	if closed(m.Done()) || m.Err() != nil {
		t.Fatalf("a held set reports Done closed or Err %v", m.Err())
	}
	if err := m.Release(); err != nil {
		t.Fatalf("Release of the set: %v", err)
	}
	if !closed(m.Done()) || m.Err() != nil {
		t.Fatalf("after Release: Done closed %v, Err %v", closed(m.Done()), m.Err())
	}
	for _, name := range []string{a, b, c} {
		s.mustRelease(t, s.mustAcquire(t, s.New(t), name))
	}
}

// acquireAllAtomic: a set with one name held by another fails, with
// ErrLocked, and holds none of the others afterwards — at once, and after
// a wait that runs out.
func (s *suite) acquireAllAtomic(t *testing.T) {
	a, b, c := s.name(t, "a"), s.name(t, "b"), s.name(t, "c")
	other := s.mustAcquire(t, s.New(t), b)
	m, err := lock.AcquireAll(ctxT(t), s.New(t), c, b, a)
	if err == nil {
		m.Release()
		t.Fatal("AcquireAll succeeded with a member held by another")
	}
	if !errors.Is(err, s.ErrLocked) || !errors.Is(err, lock.ErrLocked) {
		t.Fatalf("AcquireAll with a member held = %v; want ErrLocked", err)
	}
	for _, name := range []string{a, c} {
		s.mustRelease(t, s.mustAcquire(t, s.New(t), name)) // not waiting: free now
	}
	if s.Wait {
		ctx, cancel := context.WithTimeout(ctxT(t), 200*time.Millisecond)
		m, err := lock.AcquireAll(ctx, s.New(t, lock.WithWait()), c, b, a)
		cancel()
		if err == nil {
			m.Release()
			t.Fatal("a waiting AcquireAll succeeded with a member held by another")
		}
		if !errors.Is(err, lock.ErrLocked) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("a waiting AcquireAll that ran out = %v; want ErrLocked and DeadlineExceeded", err)
		}
		s.mustRelease(t, s.mustAcquire(t, s.New(t), a)) // taken before the wait, released after
	}
	s.mustRelease(t, other)
}

// acquireAllLoss: the loss of one member ends the set, naming it; Release
// frees what is left.
func (s *suite) acquireAllLoss(t *testing.T) {
	if s.Lose == nil {
		t.Skip("backend gave no way to force a loss")
	}
	a, b := s.name(t, "a"), s.name(t, "b")
	m, err := lock.AcquireAll(ctxT(t), s.New(t), a, b)
	if err != nil {
		t.Fatalf("AcquireAll: %v", err)
	}
	s.Lose(t, m.Member(b))
	eventually(t, m.Done(), s.LossBound, "a set ending when a member is lost")
	// A backend may lose a with b (pglock: one session holds both).
	err = m.Err()
	names := err != nil && strings.Contains(err.Error(), fmt.Sprintf("%q", b)) || err != nil && m.Member(a).Err() != nil && strings.Contains(err.Error(), fmt.Sprintf("%q", a))
	if !errors.Is(err, lock.ErrLockLost) || !errors.Is(err, s.ErrLockLost) || !names {
		t.Fatalf("Err after a member's loss = %v; want ErrLockLost naming the lost member %q", err, b)
	}
	if err := m.Release(); !errors.Is(err, lock.ErrLockLost) {
		t.Fatalf("Release after a member's loss = %v; want ErrLockLost", err)
	}
	for _, name := range []string{a, b} {
		s.mustRelease(t, s.acquireWithin(t, name, s.LossBound))
	}
}

// acquireAllLostWaiting: a member lost while AcquireAll waits for a
// later name — by WithMaxHold, and by the backend's own way to lose a
// lock — ends the call with that member's loss, not a set with a member
// already gone; the names taken are freed and the waiter leaves the queue.
func (s *suite) acquireAllLostWaiting(t *testing.T) {
	if !s.Wait {
		t.Skip("backend does not claim Wait")
	}
	const d = 300 * time.Millisecond
	cases := []struct {
		what string
		opts []lock.Option
		lose func(t testing.TB, h lock.Holder)
		is   error
	}{{"MaxHold", []lock.Option{lock.WithWait(), lock.WithMaxHold(d)}, nil, lock.ErrMaxHold}}
	if s.Lose != nil {
		cases = append(cases, struct {
			what string
			opts []lock.Option
			lose func(t testing.TB, h lock.Holder)
			is   error
		}{"Lose", []lock.Option{lock.WithWait()}, s.Lose, s.ErrLockLost})
	}
	for _, c := range cases {
		t.Run(c.what, func(t *testing.T) {
			a, b := s.name(t, "a"), s.name(t, "b")
			hb := s.mustAcquire(t, s.New(t), b) // held elsewhere all along
			l := s.New(t, c.opts...)
			first := make(chan lock.Holder, 1)
			spy := lock.LockerFunc(func(ctx context.Context, name string) (lock.Holder, error) {
				h, err := l.Acquire(ctx, name)
				if name == a && err == nil {
					first <- h
				}
				return h, err
			})
			type result struct {
				m   *lock.MultiHolder
				err error
			}
			done := make(chan result, 1)
			go func() {
				m, err := lock.AcquireAll(ctxT(t), spy, a, b)
				done <- result{m, err}
			}()
			ha := <-first
			s.waitQueued(t, b, 1)
			if c.lose != nil {
				c.lose(t, ha)
			}
			var r result
			select {
			case r = <-done:
			case <-time.After(d + s.LossBound):
				t.Fatalf("AcquireAll still waiting for %q %v after %q was lost", b, d+s.LossBound, a)
			}
			if r.m != nil {
				r.m.Release()
				t.Fatalf("AcquireAll returned a set after its member %q was lost; Err %v, member's Err %v", a, r.m.Err(), r.m.Member(a).Err())
			}
			if err := r.err; !errors.Is(err, lock.ErrLockLost) || !errors.Is(err, c.is) || errors.Is(err, lock.ErrLocked) || !strings.Contains(err.Error(), fmt.Sprintf("%q", a)) {
				t.Fatalf("AcquireAll after %q was lost = %v; want its loss (ErrLockLost, %v) naming it, not ErrLocked", a, err, c.is)
			}
			s.mustRelease(t, s.acquireWithin(t, a, s.LossBound))
			s.mustRelease(t, hb)
			// The caller that gave up on b left nothing queued: b is free.
			s.mustRelease(t, s.mustAcquire(t, s.New(t), b))
		})
	}
}

// acquireAllNoDeadlock: clients asking WithWait for random overlapping
// sets, each listed in a random order, all get through — a deadlock runs
// out the test's context — and never share a name.
func (s *suite) acquireAllNoDeadlock(t *testing.T) {
	if !s.Wait {
		t.Skip("backend does not claim Wait")
	}
	names := make([]string, 5)
	for i := range names {
		names[i] = s.name(t, fmt.Sprint(i))
	}
	inside := make([]atomic.Int32, len(names))
	rounds := max(s.Rounds/5, 4)
	ctx := ctxT(t)
	var violations atomic.Int32
	var wg sync.WaitGroup
	errc := make(chan error, s.Workers)
	for w := range s.Workers {
		l := s.New(t, lock.WithWait()) // a client per worker, like separate processes
		rng := rand.New(rand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
		wg.Go(func() {
			for r := range rounds {
				pick := rng.Perm(len(names))[:2+rng.IntN(3)]
				set := make([]string, len(pick))
				for j, i := range pick {
					set[j] = names[i]
				}
				m, err := lock.AcquireAll(ctx, l, set...)
				if err != nil {
					errc <- fmt.Errorf("round %d, AcquireAll(%q): %w (a deadlock runs out the context)", r, set, err)
					return
				}
				for _, i := range pick {
					if inside[i].Add(1) > 1 {
						violations.Add(1)
					}
				}
				runtime.Gosched()
				time.Sleep(100 * time.Microsecond)
				for _, i := range pick {
					inside[i].Add(-1)
				}
				if err := m.Release(); err != nil {
					errc <- fmt.Errorf("round %d, Release: %w", r, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Error(err)
	}
	if n := violations.Load(); n > 0 {
		t.Errorf("%d times two sets held one name at once", n)
	}
}
