package lock

import (
	"context"
	"errors"
	"time"
)

// Op names the operation an Event reports.
type Op string

// The operations backends report.
const (
	OpAcquire Op = "acquire"
	OpRelease Op = "release"
	OpExtend  Op = "extend"
	OpLost    Op = "lost" // the backend noticed the lock was lost
)

// Outcome classifies how an operation ended. The set is closed, so it is
// safe as a metric label.
type Outcome string

// The outcomes.
const (
	OutcomeOK       Outcome = "ok"
	OutcomeLocked   Outcome = "locked"   // contention: someone else holds it
	OutcomeCanceled Outcome = "canceled" // the caller's context ended
	OutcomeLost     Outcome = "lost"     // the lock was no longer ours
	OutcomeInvalid  Outcome = "invalid"  // the caller's mistake: a bad name or option, a limit mismatch
	OutcomeError    Outcome = "error"    // the backend failed
)

// Reason says why a lock was lost: the Reason of an OpLost event. The set
// is closed, so it is safe as a metric label.
type Reason string

// The reasons.
const (
	ReasonExpired Reason = "expired"  // ErrLeaseExpired
	ReasonSession Reason = "session"  // ErrSessionEnded
	ReasonRemoved Reason = "removed"  // ErrRemoved: lock break, a delete by hand, a failover
	ReasonMaxHold Reason = "max_hold" // ErrMaxHold: WithMaxHold at work, not a fault
	ReasonClosed  Reason = "closed"   // ErrClosed: the factory's Close, asked for
	ReasonOther   Reason = "other"    // a loss that says no more (a test's forced loss)
)

// ReasonOf classifies a loss error; "" if err is no loss.
func ReasonOf(err error) Reason {
	switch {
	case !errors.Is(err, ErrLockLost):
		return ""
	case errors.Is(err, ErrMaxHold):
		return ReasonMaxHold
	case errors.Is(err, ErrClosed):
		return ReasonClosed
	case errors.Is(err, ErrLeaseExpired):
		return ReasonExpired
	case errors.Is(err, ErrSessionEnded):
		return ReasonSession
	case errors.Is(err, ErrRemoved):
		return ReasonRemoved
	}
	return ReasonOther
}

// OutcomeOf classifies err.
func OutcomeOf(err error) Outcome {
	switch {
	case err == nil:
		return OutcomeOK
	case errors.Is(err, ErrLocked):
		return OutcomeLocked
	case errors.Is(err, ErrLockLost):
		return OutcomeLost
	case errors.Is(err, ErrInvalidName), errors.Is(err, ErrInvalidOption), errors.Is(err, ErrLimitMismatch):
		return OutcomeInvalid
	case onlyContext(err):
		return OutcomeCanceled
	}
	return OutcomeError
}

// onlyContext reports whether the context's end is all err says: every
// error it wraps, down to those that wrap nothing, is context.Canceled or
// context.DeadlineExceeded. A wait that gave up because the backend failed
// also matches the context's error, and is a failure.
func onlyContext(err error) bool {
	switch u := err.(type) {
	case interface{ Unwrap() []error }:
		for _, e := range u.Unwrap() {
			if !onlyContext(e) {
				return false
			}
		}
		return true
	case interface{ Unwrap() error }:
		if e := u.Unwrap(); e != nil {
			return onlyContext(e)
		}
	}
	return err == context.Canceled || err == context.DeadlineExceeded
}

// An Event describes one lock operation.
//
// Backend, Op and Outcome take few values and are what metrics should be
// labelled with. Name is unbounded (every tenant, every job
// id): it goes to logs and traces, not to metric labels.
type Event struct {
	Backend string
	Op      Op
	Outcome Outcome
	Name    string
	Token   uint64
	Latency time.Duration // the whole operation, waiting included
	Wait    time.Duration // time spent waiting for another holder (WithWait)
	Held    time.Duration // for release and lost: how long the lock was held
	Reason  Reason        // for lost: why (see ReasonOf)
	Err     error
}

// An Observer receives every Event, synchronously, with the context of the
// operation (for lost locks, the context the lock was acquired with, without
// its cancellation). Implementations must be fast and safe for concurrent
// use.
type Observer interface {
	Observe(ctx context.Context, e Event)
}

// observers hands every Event to each of its observers, in order.
type observers []Observer

func (os observers) Observe(ctx context.Context, e Event) {
	for _, o := range os {
		o.Observe(ctx, e)
	}
}

// joinObservers returns an Observer that hands every Event to a, then b.
func joinObservers(a, b Observer) Observer {
	switch {
	case a == nil:
		return b
	case b == nil:
		return a
	}
	as, ok := a.(observers)
	if !ok {
		as = observers{a}
	}
	return append(as[:len(as):len(as)], b)
}

// ObserverFunc adapts a function to the Observer interface.
type ObserverFunc func(ctx context.Context, e Event)

// Observe calls f(ctx, e).
func (f ObserverFunc) Observe(ctx context.Context, e Event) { f(ctx, e) }
