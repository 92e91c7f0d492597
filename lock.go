// Package lock defines a small contract for named locks and the helpers that
// work with any implementation of it.
//
// Application code is written against [Locker] and [Holder]; a backend is
// chosen at start-up: memlock in tests, flock or filelock on one host,
// pglock, redislock or etcdlock across replicas. Every backend returns errors
// that match this package's sentinels with [errors.Is], accepts the options
// declared here under the same names, and passes the conformance suite in
// package locktest.
package lock

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"time"
)

// A Locker acquires named locks.
//
// Acquire does not block on contention unless the backend was configured with
// [WithWait]: a lock held by someone else yields an error matching
// [ErrLocked] at once. A nil error always comes with a non-nil Holder.
type Locker interface {
	Acquire(ctx context.Context, name string) (Holder, error)
}

// A Holder is one acquired lock (or one permit of a semaphore).
type Holder interface {
	// Release gives the lock up. It is idempotent, safe to call from any
	// goroutine, and does not depend on the Acquire context: backends bound
	// the release on their own. Releasing a lock that was lost returns an
	// error matching ErrLockLost and never frees a successor's lock.
	Release() error
	// Token is the fencing token: greater than zero and strictly larger
	// than the token of every earlier holder of the same name.
	Token() uint64
	// Done is closed when the lock is released or lost.
	Done() <-chan struct{}
	// Err is nil while the lock is held and after a clean Release; it
	// matches ErrLockLost once the lock has been lost.
	Err() error
}

// LockerFunc adapts a function to the Locker interface.
type LockerFunc func(ctx context.Context, name string) (Holder, error)

// Acquire calls f(ctx, name).
func (f LockerFunc) Acquire(ctx context.Context, name string) (Holder, error) { return f(ctx, name) }

// A Configured Locker reports the options every Acquire through it uses,
// and their error. Every backend's AsLocker returns one, so that an adapter
// handed a Locker (contrib/gocronlock) can refuse at start-up a
// configuration that would misbehave under it.
type Configured interface {
	Locker
	Config() (Options, error)
}

// An Extender is a Holder whose lock is a lease that can be renewed.
// Extend pushes the expiry one TTL into the future; once the lock is lost it
// returns an error matching ErrLockLost.
type Extender interface {
	Extend(ctx context.Context) error
}

// KeepAlive renews h's lease every interval for as long as the returned
// context lives, and gives the work under a bare Acquire the context that
// WithLock would: it replaces the hand-written watch-and-renew goroutine.
// Leases renew by themselves unless taken with WithAutoRenew(false); with
// it, KeepAlive's renewals are the only ones. The context is cancelled —
// the work it guards should stop — when h's lock ends, or when an Extend
// fails or takes longer than every, with a cause matching ErrLockLost. A
// failed renewal is not retried: the lease can no longer be vouched for. If every is at most a third of the
// TTL, the loss is declared before the lease can run out on the server.
//
// A holder that cannot be extended (not an [Extender]) is only watched.
// The context carries h (see HolderFrom).
// Call cancel when the work is done, before releasing h: it stops the
// renewals and returns once none is in flight, so no Extend races the
// Release. It does not release h.
func KeepAlive(ctx context.Context, h Holder, every time.Duration) (context.Context, context.CancelFunc) {
	kctx, cancel := context.WithCancelCause(context.WithValue(ctx, holderKey{}, h))
	if h == nil || every <= 0 {
		cancel(fmt.Errorf("%w: KeepAlive needs a Holder and a positive interval, got %v", ErrInvalidOption, every))
		return kctx, func() {}
	}
	ext, _ := h.(Extender)
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		var tick <-chan time.Time
		if ext != nil {
			t := time.NewTicker(every)
			defer t.Stop()
			tick = t.C
		}
		for {
			select {
			case <-kctx.Done():
				return
			case <-h.Done():
				cause := h.Err()
				if cause == nil {
					cause = ErrLockLost
				}
				cancel(cause)
				return
			case <-tick:
				if kctx.Err() != nil {
					return // both were ready: the caller's cancel wins
				}
				ectx, ecancel := context.WithTimeout(kctx, every)
				err := ext.Extend(ectx)
				ecancel()
				if err == nil {
					continue
				}
				if kctx.Err() != nil {
					return // stopped by the caller while extending
				}
				select {
				case <-h.Done():
					// The lock ended while extending: its own error says
					// why (a WithMaxHold, a loss), not the Extend's echo.
					if herr := h.Err(); herr != nil {
						err = herr
					}
				default:
				}
				if !errors.Is(err, ErrLockLost) {
					err = fmt.Errorf("%w: renewal failed: %w", ErrLockLost, err)
				}
				cancel(err)
				return
			}
		}
	}()
	return kctx, func() {
		cancel(nil)
		<-stopped
	}
}

// An Inspector reports who holds a name without taking it. Backends'
// factories implement it where their storage can tell.
type Inspector interface {
	Inspect(ctx context.Context, name string) (Info, error)
}

// A Lister lists the names that are held (or waited for), for operators.
// Backends' factories implement it.
//
// List yields one Info per held name that starts with prefix ("" lists
// every name), in an order each backend documents. It reads the store in
// pages of at most [ListPageSize] entries, so a store with a million names
// never sits in memory at once, and stops reading when the loop breaks. An
// error ends the iteration with (Info{}, err). A name taken or released
// while the listing runs may or may not be listed.
type Lister interface {
	List(ctx context.Context, prefix string) iter.Seq2[Info, error]
}

// ListPageSize is the most entries (keys, files, rows) a Lister fetches
// from its store at once.
const ListPageSize = 256

// Info describes the current state of one name.
type Info struct {
	Name    string
	Limit   int          // 1 for a mutex, n for a semaphore; 0 when nobody holds it
	Holders []HolderInfo // empty when the name is free
	Waiting int          // Acquires waiting for the name; 0: unknown or none
}

// HolderInfo describes one current holder. Fields a backend cannot know are
// zero.
type HolderInfo struct {
	Token    uint64
	ID       string            // the backend's identity of the holder: pid@host, backend pid, lease id, ...
	Owner    string            // set with WithOwner
	Since    time.Time         // when the lock was acquired
	Expires  time.Time         // lease expiry; zero for session and kernel locks
	Metadata map[string]string // set with WithMetadata
}

// WithLock acquires name from l, runs fn, and releases the lock.
//
// The context passed to fn is cancelled, with cause ErrLockLost, when the lock
// is lost, and carries the holder (see HolderFrom). The lock is released when fn returns or panics (the panic then
// continues). A release error, or the loss of the lock while fn ran, is
// joined to fn's error and never hides it.
func WithLock(ctx context.Context, l Locker, name string, fn func(ctx context.Context) error) (err error) {
	h, err := l.Acquire(ctx, name)
	if err != nil {
		return err
	}
	defer releaseInto(h, &err)
	hctx, stop := heldContext(ctx, h)
	defer stop()
	return fn(hctx)
}

// HolderFrom returns the Holder whose lock the work under ctx holds: the
// fn of WithLock (and so of every backend's WithLock, RunOnce and
// HoldAtLeast) and the work under KeepAlive find it in their context, for
// its fencing token or its backend's own methods. ok is false elsewhere.
//
//	factory.WithLock(ctx, "ledger", func(ctx context.Context) error {
//		h, _ := lock.HolderFrom(ctx)
//		return store.Write(ctx, h.Token(), entry)
//	})
func HolderFrom(ctx context.Context) (h Holder, ok bool) {
	h, ok = ctx.Value(holderKey{}).(Holder)
	return h, ok
}

type holderKey struct{}

// heldContext returns a context that is cancelled when h's lock ends: with
// h.Err() as the cause when it was lost, ErrLockLost when it ended some other
// way behind the caller's back. stop cancels it and ends the watch.
// A lock that ended before heldContext returns (lost while the caller was
// paused after Acquire) cancels hctx before it is returned.
func heldContext(ctx context.Context, h Holder) (hctx context.Context, stop func()) {
	hctx, cancel := context.WithCancelCause(context.WithValue(ctx, holderKey{}, h))
	end := func() {
		cause := h.Err()
		if cause == nil {
			cause = ErrLockLost
		}
		cancel(cause)
	}
	select {
	case <-h.Done():
		end()
	default:
		go func() {
			select {
			case <-h.Done():
				end()
			case <-hctx.Done():
			}
		}()
	}
	return hctx, func() { cancel(nil) }
}

// releaseInto releases h and joins a release error, or the loss of the lock
// while it was held, to *err.
func releaseInto(h Holder, err *error) {
	lost := h.Err()
	rerr := h.Release()
	if rerr == nil && lost != nil {
		rerr = lost
	}
	// fn often returns its context's cause, which is the loss itself.
	if rerr != nil && !errors.Is(*err, rerr) {
		*err = errors.Join(*err, rerr)
	}
}
