package lock

import (
	"context"
	"errors"
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
)

// WaitError is returned when an Acquire with WithWait gives up because its
// context ended: while queued, during an attempt, or before the first one
// (a context already done). It matches both the backend's ErrLocked and the context's
// error (or cause), so either check works:
//
//	errors.Is(err, lock.ErrLocked)
//	errors.Is(err, context.DeadlineExceeded)
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
