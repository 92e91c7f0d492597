package backend_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/backend"
)

// toySub is a subscription woken by hand.
type toySub struct {
	wake   chan struct{}
	closed bool
}

func (s *toySub) Wake() <-chan struct{} { return s.wake }
func (s *toySub) Close()                { s.closed = true }

// toyLock is held until free is closed; attempts counts the tries.
type toyLock struct {
	free     chan struct{}
	attempts int
	sub      *toySub
}

func newToyLock() *toyLock {
	return &toyLock{free: make(chan struct{}), sub: &toySub{wake: make(chan struct{}, 1)}}
}

func (l *toyLock) attempt() (int, time.Duration, error) {
	l.attempts++
	select {
	case <-l.free:
		return l.attempts, 0, nil
	default:
		return 0, 0, lock.ErrLocked
	}
}

func (l *toyLock) waiting(wait bool) backend.Waiting {
	return backend.Waiting{
		Wait: wait, Locked: lock.ErrLocked, MinPoll: time.Hour, MaxPoll: time.Hour,
		Subscribe: func() (backend.Subscription, error) { return l.sub, nil },
	}
}

func TestWaitWithoutWaitReturnsContention(t *testing.T) {
	l := newToyLock()
	_, waited, err := backend.Wait(context.Background(), l.waiting(false), l.attempt)
	if !errors.Is(err, lock.ErrLocked) || waited != 0 || l.attempts != 1 || l.sub.closed {
		t.Fatalf("err %v, waited %v, %d attempts, subscribed %v: want ErrLocked after one attempt, no subscription", err, waited, l.attempts, l.sub.closed)
	}
}

// The first contention subscribes and tries again at once; then only a
// wake-up (the poll is an hour) brings another attempt.
func TestWaitRetriesAfterSubscribingThenOnWake(t *testing.T) {
	l := newToyLock()
	tries := make(chan int)
	w := l.waiting(true)
	attempt := func() (int, time.Duration, error) {
		n, d, err := l.attempt()
		tries <- l.attempts
		return n, d, err
	}
	done := make(chan error)
	go func() {
		_, _, err := backend.Wait(context.Background(), w, attempt)
		done <- err
	}()
	if n := <-tries; n != 1 {
		t.Fatal(n)
	}
	if n := <-tries; n != 2 { // at once after subscribing
		t.Fatal(n)
	}
	close(l.free)
	l.sub.wake <- struct{}{}
	if n := <-tries; n != 3 {
		t.Fatal(n)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !l.sub.closed {
		t.Error("subscription left open")
	}
}

func TestWaitEndsWithContextAndClose(t *testing.T) {
	l := newToyLock()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	// The attempts found the name held: the wait gave up on contention.
	if _, _, err := backend.Wait(ctx, l.waiting(true), l.attempt); !errors.Is(err, lock.ErrLocked) || !errors.Is(err, context.Canceled) || !l.sub.closed {
		t.Fatalf("cancelled wait: %v (subscription closed %v), want a WaitError", err, l.sub.closed)
	}
	l = newToyLock()
	w := l.waiting(true)
	closed := make(chan struct{})
	close(closed)
	w.Closed = closed
	if _, _, err := backend.Wait(context.Background(), w, l.attempt); err != lock.ErrClosed {
		t.Fatalf("closed factory: %v, want ErrClosed", err)
	}
}

// With WithWait and ctx done, an attempt's failure is a wait that gave up
// on contention only if the last completed attempt found the name held and
// the failure is ctx's; a backend's failure is returned, matching ctx's
// error and the failure but not ErrLocked; and an attempt cut short before
// any told leaves ctx's error for Finish to decide.
func TestWaitFailedAttemptAfterContextEnds(t *testing.T) {
	broken := errors.New("connection reset")
	for _, tc := range []struct {
		what         string
		first, then  error // the first attempt's error, and the next one's, returned after cancel
		locked, same bool  // want ErrLocked; want exactly context.Canceled
	}{
		{"held, then cut short", lock.ErrLocked, context.Canceled, true, false},
		{"held, then broken", lock.ErrLocked, broken, false, false},
		{"broken after cancel", nil, broken, false, false},
		{"cut short before any told", nil, context.Canceled, false, true},
	} {
		l := newToyLock()
		ctx, cancel := context.WithCancel(context.Background())
		attempt := func() (int, time.Duration, error) {
			if l.attempts++; l.attempts == 1 && tc.first != nil {
				return 0, 0, tc.first
			}
			cancel()
			return 0, 0, tc.then
		}
		_, _, err := backend.Wait(ctx, l.waiting(true), attempt)
		if errors.Is(err, lock.ErrLocked) != tc.locked || !errors.Is(err, context.Canceled) || (err == context.Canceled) != tc.same {
			t.Errorf("%s: %v; want ErrLocked %v, context.Canceled, bare %v", tc.what, err, tc.locked, tc.same)
		}
		if tc.then == broken && !errors.Is(err, broken) {
			t.Errorf("%s: %v; want it to carry the attempt's failure", tc.what, err)
		}
	}
	if _, _, err := backend.Wait(context.Background(), newToyLock().waiting(false), func() (int, time.Duration, error) { return 0, 0, broken }); err != broken {
		t.Fatalf("%v, want the attempt's error", err)
	}
	if _, _, err := backend.Wait(context.Background(), newToyLock().waiting(true), func() (int, time.Duration, error) { return 0, 0, broken }); err != broken {
		t.Fatalf("waiting, ctx live: %v, want the attempt's error", err)
	}
}

// Queued subscribes first and makes no attempt until woken.
func TestWaitQueued(t *testing.T) {
	l := newToyLock()
	w := l.waiting(true)
	w.Queued = true
	close(l.free)
	done := make(chan int)
	go func() {
		n, _, _ := backend.Wait(context.Background(), w, l.attempt)
		done <- n
	}()
	select {
	case n := <-done:
		t.Fatalf("queued waiter attempted (attempt %d) before it was woken", n)
	case <-time.After(50 * time.Millisecond):
	}
	l.sub.wake <- struct{}{}
	if n := <-done; n != 1 {
		t.Fatalf("acquired on attempt %d, want 1", n)
	}
}

// An attempt's hint caps the poll: a lease that runs out in 1 ms is
// tried again then, though no wake-up comes and the poll is an hour.
func TestWaitHintCapsPoll(t *testing.T) {
	l := newToyLock()
	attempt := func() (int, time.Duration, error) {
		if l.attempts++; l.attempts < 4 {
			return 0, time.Millisecond, lock.ErrLocked
		}
		return l.attempts, 0, nil
	}
	if n, _, err := backend.Wait(context.Background(), l.waiting(true), attempt); err != nil || n != 4 {
		t.Fatalf("%d, %v", n, err)
	}
}

// A wait whose last look would be older than Fresh at its deadline looks
// once more before it, however long the poll: the WaitError it returns
// says the name was held lately.
func TestWaitLooksBeforeDeadline(t *testing.T) {
	l := newToyLock()
	var sent []time.Time
	attempt := func() (int, time.Duration, error) {
		sent = append(sent, time.Now())
		return l.attempt()
	}
	start := time.Now()
	end := start.Add(backend.Fresh + 300*time.Millisecond)
	ctx, cancel := context.WithDeadline(context.Background(), end)
	defer cancel()
	_, _, err := backend.Wait(ctx, l.waiting(true), attempt) // polls every hour
	if !errors.Is(err, lock.ErrLocked) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v; want a WaitError", err)
	}
	last := sent[len(sent)-1]
	if len(sent) != 3 || last.Before(end.Add(-backend.Fresh)) {
		t.Fatalf("attempts at %v after the start, deadline %v; want a third within %v of the deadline", offsets(start, sent), end.Sub(start), backend.Fresh)
	}
}

func offsets(start time.Time, ts []time.Time) []time.Duration {
	var d []time.Duration
	for _, t := range ts {
		d = append(d, t.Sub(start).Round(time.Millisecond))
	}
	return d
}

// Early subscribes before the first attempt and makes it at once; the
// first contention brings no second attempt (the subscription covered the
// first), only a wake does. An uncontended Early wait waited 0.
func TestWaitEarly(t *testing.T) {
	l := newToyLock()
	w := l.waiting(true)
	w.Early = true
	subscribed := 0
	w.Subscribe = func() (backend.Subscription, error) { subscribed++; return l.sub, nil }
	tries := make(chan int)
	go func() {
		for n := range tries {
			if n == 1 {
				close(l.free)
				l.sub.wake <- struct{}{}
			}
		}
	}()
	n, waited, err := backend.Wait(context.Background(), w, func() (int, time.Duration, error) {
		n, d, err := l.attempt()
		tries <- l.attempts
		return n, d, err
	})
	close(tries)
	if err != nil || n != 2 || subscribed != 1 || waited == 0 {
		t.Fatalf("acquired on attempt %d (%v), %d subscriptions, waited %v; want the second attempt, after one wake", n, err, subscribed, waited)
	}
	l = newToyLock()
	close(l.free)
	w = l.waiting(true)
	w.Early = true
	if n, waited, err := backend.Wait(context.Background(), w, l.attempt); err != nil || n != 1 || waited != 0 {
		t.Fatalf("free name: attempt %d, waited %v, %v; want the first, no wait", n, waited, err)
	}
}
