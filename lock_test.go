package lock_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/backend"
)

var errToyLost = fmt.Errorf("toy: %w", lock.ErrLockLost)

// stub is a holder whose behaviour each test sets.
type stub struct {
	state      *backend.State
	releaseErr error
	released   int
}

func newStub() *stub                  { return &stub{state: backend.NewState()} }
func (s *stub) Token() uint64         { return 1 }
func (s *stub) Done() <-chan struct{} { return s.state.Done() }
func (s *stub) Err() error            { return s.state.Err() }
func (s *stub) Release() error        { s.released++; s.state.End(); return s.releaseErr }
func (s *stub) locker() lock.Locker {
	return lock.LockerFunc(func(context.Context, string) (lock.Holder, error) { return s, nil })
}

func TestWithLockReleases(t *testing.T) {
	s := newStub()
	err := lock.WithLock(context.Background(), s.locker(), "n", func(context.Context) error { return nil })
	if err != nil || s.released != 1 {
		t.Fatalf("err %v, released %d", err, s.released)
	}
}

func TestWithLockJoinsReleaseError(t *testing.T) {
	s := newStub()
	fnErr, relErr := errors.New("fn"), errors.New("release")
	s.releaseErr = relErr
	err := lock.WithLock(context.Background(), s.locker(), "n", func(context.Context) error { return fnErr })
	if !errors.Is(err, fnErr) || !errors.Is(err, relErr) {
		t.Fatalf("err = %v; want both fn's and Release's errors", err)
	}
}

func TestWithLockPanicReleasesThenRepanics(t *testing.T) {
	s := newStub()
	defer func() {
		if r := recover(); r != "boom" || s.released != 1 {
			t.Fatalf("recovered %v, released %d", r, s.released)
		}
	}()
	lock.WithLock(context.Background(), s.locker(), "n", func(context.Context) error { panic("boom") })
}

func TestWithLockCancelsOnLoss(t *testing.T) {
	s := newStub()
	err := lock.WithLock(context.Background(), s.locker(), "n", func(ctx context.Context) error {
		s.state.Lose(errToyLost)
		<-ctx.Done()
		if !errors.Is(context.Cause(ctx), lock.ErrLockLost) {
			t.Errorf("cause = %v", context.Cause(ctx))
		}
		return nil
	})
	// fn returned nil, but its work was not protected to the end: say so.
	if !errors.Is(err, lock.ErrLockLost) {
		t.Fatalf("err = %v; want ErrLockLost", err)
	}
}

// A lock lost before WithLock calls fn (its caller paused after the
// Acquire) gives fn a context cancelled already, with the loss as cause.
func TestWithLockLostBeforeFn(t *testing.T) {
	s := newStub()
	s.state.Lose(errToyLost)
	err := lock.WithLock(context.Background(), s.locker(), "n", func(ctx context.Context) error {
		if !errors.Is(context.Cause(ctx), errToyLost) {
			t.Errorf("fn started with cause %v; want the loss", context.Cause(ctx))
		}
		return nil
	})
	if !errors.Is(err, lock.ErrLockLost) {
		t.Fatalf("err = %v; want ErrLockLost", err)
	}
}

func TestWithLockAcquireError(t *testing.T) {
	l := lock.LockerFunc(func(context.Context, string) (lock.Holder, error) { return nil, lock.ErrLocked })
	ran := false
	err := lock.WithLock(context.Background(), l, "n", func(context.Context) error { ran = true; return nil })
	if ran || !errors.Is(err, lock.ErrLocked) {
		t.Fatalf("ran %v err %v", ran, err)
	}
}

func TestValidateName(t *testing.T) {
	for _, ok := range []string{"a", "a/b", "../../etc/passwd", "ünï ☃", strings.Repeat("x", lock.MaxNameLen)} {
		if err := lock.ValidateName(ok); err != nil {
			t.Errorf("ValidateName(%.20q) = %v", ok, err)
		}
	}
	for _, bad := range []string{"", "a\x00", "\xff", strings.Repeat("x", lock.MaxNameLen+1)} {
		if err := lock.ValidateName(bad); !errors.Is(err, lock.ErrInvalidName) {
			t.Errorf("ValidateName(%.20q) = %v; want ErrInvalidName", bad, err)
		}
	}
}

func TestApplyOptions(t *testing.T) {
	base, err := lock.Apply(lock.Options{}, lock.WithTTL(time.Second), lock.WithMetadata("a", "1"))
	if err != nil {
		t.Fatal(err)
	}
	o, err := lock.Apply(base, lock.WithMetadata("b", "2"), lock.WithMaxConcurrent(3), lock.WithWait())
	if err != nil {
		t.Fatal(err)
	}
	if o.TTL != time.Second || o.Limit() != 3 || !o.Wait || len(o.Metadata) != 2 {
		t.Fatalf("options %+v", o)
	}
	if len(base.Metadata) != 1 {
		t.Fatal("a per-call option changed the defaults it was applied to")
	}
	if base.Limit() != 1 || base.NoAutoRenew {
		t.Fatal("defaults")
	}
	for _, bad := range []lock.Option{lock.WithTTL(0), lock.WithTTL(-1), lock.WithMaxConcurrent(0), lock.WithDir("")} {
		if _, err := lock.Apply(base, bad); !errors.Is(err, lock.ErrInvalidOption) {
			t.Errorf("bad option accepted: %v", err)
		}
	}
	// An invalid default is reported by every later Apply.
	bad, _ := lock.Apply(lock.Options{}, lock.WithTTL(-1))
	if _, err := lock.Apply(bad, lock.WithWait()); !errors.Is(err, lock.ErrInvalidOption) {
		t.Fatalf("invalid default forgotten: %v", err)
	}
}

// A name is shared or a semaphore: WithShared beside WithMaxConcurrent(n >
// 1) is invalid, in one call or across defaults and a call, once.
func TestSharedOption(t *testing.T) {
	o, err := lock.Apply(lock.Options{}, lock.WithShared(), lock.WithMaxConcurrent(1))
	if err != nil || !o.Shared {
		t.Fatalf("WithShared with WithMaxConcurrent(1): %+v, %v", o, err)
	}
	sem, err := lock.Apply(lock.Options{}, lock.WithMaxConcurrent(3))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lock.Apply(sem, lock.WithShared()); !errors.Is(err, lock.ErrInvalidOption) || !strings.Contains(err.Error(), "WithShared with WithMaxConcurrent(3)") {
		t.Fatalf("WithShared over a semaphore default = %v; want ErrInvalidOption", err)
	}
	if _, err := lock.Apply(sem, lock.WithShared(), lock.WithMaxConcurrent(1)); err != nil {
		t.Fatalf("WithShared with the default overridden to 1: %v", err)
	}
	both, err := lock.Apply(lock.Options{}, lock.WithMaxConcurrent(2), lock.WithShared())
	if !errors.Is(err, lock.ErrInvalidOption) {
		t.Fatalf("WithMaxConcurrent(2), WithShared = %v; want ErrInvalidOption", err)
	}
	if _, err := lock.Apply(both, lock.WithWait()); err == nil || strings.Count(err.Error(), "WithShared") != 1 {
		t.Fatalf("an invalid default reported again: %v; want it once", err)
	}
}

func TestWaitError(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Nanosecond)
	defer cancel()
	<-ctx.Done()
	backendLocked := fmt.Errorf("toy: %w", lock.ErrLocked)
	err := lock.NewWaitError(backendLocked, ctx)
	for _, want := range []error{backendLocked, lock.ErrLocked, context.DeadlineExceeded} {
		if !errors.Is(err, want) {
			t.Errorf("%v does not match %v", err, want)
		}
	}
	if lock.OutcomeOf(err) != lock.OutcomeLocked {
		t.Errorf("outcome %v", lock.OutcomeOf(err))
	}
}

func TestOutcomeOf(t *testing.T) {
	for err, want := range map[error]lock.Outcome{
		nil:                   lock.OutcomeOK,
		lock.ErrLocked:        lock.OutcomeLocked,
		errToyLost:            lock.OutcomeLost,
		context.Canceled:      lock.OutcomeCanceled,
		errors.New("network"): lock.OutcomeError,
		fmt.Errorf("toy: acquire: %w", context.DeadlineExceeded):                                                      lock.OutcomeCanceled,
		fmt.Errorf("toy: no answer: gave up waiting: %w", errors.Join(context.DeadlineExceeded, errors.New("reset"))): lock.OutcomeError,
		fmt.Errorf("toy: %w: bad", lock.ErrInvalidName):                                                               lock.OutcomeInvalid,
		fmt.Errorf("toy: %w", lock.ErrInvalidOption):                                                                  lock.OutcomeInvalid,
		fmt.Errorf("toy: %w", lock.ErrLimitMismatch):                                                                  lock.OutcomeInvalid,
	} {
		if got := lock.OutcomeOf(err); got != want {
			t.Errorf("OutcomeOf(%v) = %v, want %v", err, got, want)
		}
	}
}

// fn finds the holder in its context, as does the work under KeepAlive;
// elsewhere there is none.
func TestHolderFrom(t *testing.T) {
	s := newStub()
	if _, ok := lock.HolderFrom(context.Background()); ok {
		t.Fatal("HolderFrom of a bare context found a holder")
	}
	err := lock.WithLock(context.Background(), s.locker(), "n", func(ctx context.Context) error {
		if h, ok := lock.HolderFrom(ctx); !ok || h != lock.Holder(s) {
			t.Errorf("HolderFrom in WithLock's fn = %v, %v; want the holder", h, ok)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := lock.KeepAlive(context.Background(), s, time.Hour)
	defer stop()
	if h, ok := lock.HolderFrom(ctx); !ok || h != lock.Holder(s) {
		t.Errorf("HolderFrom under KeepAlive = %v, %v; want the holder", h, ok)
	}
}

// Observers add up: each WithObserver adds one, and each gets every Event.
func TestWithObserverAdds(t *testing.T) {
	var got []string
	obs := func(name string) lock.Observer {
		return lock.ObserverFunc(func(context.Context, lock.Event) { got = append(got, name) })
	}
	o, err := lock.Apply(lock.Options{}, lock.WithObserver(obs("prom")), lock.WithObserver(nil), lock.WithObserver(obs("otel")))
	if err != nil {
		t.Fatal(err)
	}
	o2, _ := lock.Apply(o, lock.WithObserver(obs("call"))) // a call's own adds to the factory's
	o.Observer.Observe(context.Background(), lock.Event{})
	o2.Observer.Observe(context.Background(), lock.Event{})
	if want := []string{"prom", "otel", "prom", "otel", "call"}; !slices.Equal(got, want) {
		t.Fatalf("observers saw %q; want %q", got, want)
	}
}

func TestReasonOf(t *testing.T) {
	for err, want := range map[error]lock.Reason{
		nil:             "",
		lock.ErrLocked:  "",
		errToyLost:      lock.ReasonOther,
		lock.ErrMaxHold: lock.ReasonMaxHold,
		fmt.Errorf("toy: %w: %w", lock.ErrLockLost, lock.ErrClosed): lock.ReasonClosed,
		fmt.Errorf("toy: %w: renewal failed", lock.ErrLeaseExpired): lock.ReasonExpired,
		fmt.Errorf("toy: %w: reset", lock.ErrSessionEnded):          lock.ReasonSession,
		fmt.Errorf("toy: %w: broken", lock.ErrRemoved):              lock.ReasonRemoved,
	} {
		if got := lock.ReasonOf(err); got != want {
			t.Errorf("ReasonOf(%v) = %q, want %q", err, got, want)
		}
	}
}
