package lock

import (
	"context"
	"errors"
	"fmt"
)

// The errors every backend reports. Each backend exports its own ErrLocked
// and ErrLockLost that wrap these, so errors.Is works with either.
var (
	// ErrLocked: the name is held by someone else (all permits, for a
	// semaphore) and the caller did not wait, or its wait ran out.
	ErrLocked = errors.New("lock: held by another owner")
	// ErrLockLost: a lock this holder had is no longer its own (lease
	// expired, session ended, marker taken over, or a test forced it).
	ErrLockLost = errors.New("lock: lock lost")
	// ErrInvalidName: the name is empty, too long, not UTF-8 or contains NUL.
	ErrInvalidName = errors.New("lock: invalid name")
	// ErrInvalidOption: an option value the backend cannot honour.
	ErrInvalidOption = errors.New("lock: invalid option")
	// ErrLimitMismatch: WithMaxConcurrent disagrees with the limit the
	// current holders of the same name use.
	ErrLimitMismatch = errors.New("lock: semaphore limit mismatch")
	// ErrClosed: the factory was closed.
	ErrClosed = errors.New("lock: closed")
	// ErrNotHeld: an operation on the current holders of a name (a
	// backend's Break) found none.
	ErrNotHeld = errors.New("lock: not held")
	// ErrMaxHold: the lock was held for as long as WithMaxHold allows, so
	// the backend gave it up. It wraps ErrLockLost: it is a loss, which
	// ends WithLock's context and KeepAlive's like any other.
	ErrMaxHold = fmt.Errorf("%w: held for its WithMaxHold", ErrLockLost)
)

// Why a lock was lost. A backend's loss error wraps the one that says why
// (and ErrLockLost through it), so that a caller, and an observer's
// metrics (see ReasonOf), tell a lease that ran out from an operator's
// lock break, or WithMaxHold doing its job (ErrMaxHold), or the factory's
// Close (ErrClosed).
var (
	// ErrLeaseExpired: the lease ran out before a renewal was confirmed:
	// the store was slow or out of reach, or the holder's process paused.
	ErrLeaseExpired = fmt.Errorf("%w: lease expired", ErrLockLost)
	// ErrSessionEnded: the connection or session the lock lived on ended.
	ErrSessionEnded = fmt.Errorf("%w: session ended", ErrLockLost)
	// ErrRemoved: the store no longer has the lock as this holder's: freed
	// by lock break or by hand, taken over, or lost in a failover.
	ErrRemoved = fmt.Errorf("%w: removed from the store", ErrLockLost)
)

// WaitError is returned when an Acquire with WithWait gives up because its
// context ended while the name was held: while queued, or during an
// attempt or before the first one (a context already done) if the backend
// answers. It matches both the backend's ErrLocked and the context's
// error (or cause), so either check works:
//
//	errors.Is(err, lock.ErrLocked)
//	errors.Is(err, context.DeadlineExceeded)
//
// A WaitError says the store's last answer, at most backend.Fresh old,
// was "held": a wait whose last look is older looks again before its
// deadline.
//
// An outage is not contention: a waiting Acquire that ends because the
// backend failed (an attempt's error; a store that does not answer; when
// the context ended with no fresh answer, a ping of the backend that
// fails) returns that failure, saying "<failure>: gave up waiting: <ctx
// cause>" if the context had ended; it matches the context's error and the
// failure, never ErrLocked. Every Acquire returns within backend.Grace of
// its context's end, whatever the store does.
type WaitError struct {
	Locked error // the backend's ErrLocked
	Cause  error // context.Cause of the Acquire context
}

// NewWaitError builds the error for a wait on ctx that ended; locked is the
// backend's ErrLocked.
func NewWaitError(locked error, ctx context.Context) error {
	return &WaitError{Locked: locked, Cause: context.Cause(ctx)}
}

func (e *WaitError) Error() string { return e.Locked.Error() + ": gave up waiting: " + e.Cause.Error() }

// Unwrap returns both errors.
func (e *WaitError) Unwrap() []error { return []error{e.Locked, e.Cause} }
