//go:build unix

// Package filelock is a lock backend that keeps one marker file per held
// lock, readable with cat, in a directory shared by the processes that
// contend: on one host, or on several hosts sharing a file system.
//
// A marker records the holder's pid, process start, host, token, lease,
// owner and metadata; every change to a name's markers happens under a
// short flock(2) on the name's counter file, which also keeps the last
// fencing token. A marker is taken over when its holder is provably dead
// on this machine (at once, Linux only) or when its lease (WithStaleAfter)
// has run out since its last refresh. Holders refresh in the background
// and declare the lock lost a margin before their lease runs out, from a
// timer that needs no I/O; they also read their marker back, and lose the
// lock once it is gone or no longer theirs. NewFence and NewLedger keep a
// lock.Fence and a lock.Ledger in the same directory.
//
// The package builds on Unix systems. The guide gives the files, the
// intervals and margins, the assumptions and the failure modes:
// https://github.com/ubgo/lock/blob/main/docs/guides/filelock.md
package filelock

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/backend"
)

// Errors, matching the root sentinels with errors.Is.
var (
	ErrLocked   = fmt.Errorf("filelock: %w", lock.ErrLocked)
	ErrLockLost = fmt.Errorf("filelock: %w", lock.ErrLockLost)
)

const backendName = "filelock"

// Factory hands out locks kept as marker files. Factories (in one process
// or many) that use the same directory contend with each other.
type Factory struct {
	cfg     backend.Config
	closing context.Context // done once Close is called
	stop    context.CancelFunc
	dirs    sync.Map // directory as given → absolute path, created

	mu     sync.Mutex
	closed bool
	held   map[*Holder]struct{} // holders that may still do I/O
}

// NewFactory returns a factory whose options are the defaults for every
// call. An invalid option is reported by the first Acquire.
func NewFactory(opts ...Option) *Factory {
	f := &Factory{held: map[*Holder]struct{}{}}
	f.closing, f.stop = context.WithCancel(context.Background())
	f.cfg = backend.NewConfig(backendName, opts, validate)
	return f
}

// Err returns the error of the factory's options, which every Acquire
// also returns; nil when the factory is usable. Check it at start-up.
func (f *Factory) Err() error { return f.cfg.Err }

// Acquire takes name. On contention it returns an error matching ErrLocked
// at once, or with WithWait waits until a permit is free or ctx ends. The
// marker is refreshed in the background unless WithAutoRenew(false) is
// given; then call Extend within the stale window.
func (f *Factory) Acquire(ctx context.Context, name string, opts ...Option) (*Holder, error) {
	start := time.Now()
	o, err := f.cfg.Resolve(name, opts, validate)
	return backend.Take(ctx, backend.Call{Backend: backendName, Name: name, Locked: ErrLocked, Start: start}, &o, err, func(ctx context.Context) (*Holder, time.Duration, error) {
		return f.take(ctx, name, &o)
	})
}

// dir returns the absolute lock directory of o, creating it on first use.
func (f *Factory) dir(o *lock.Options) (string, error) {
	d := o.Dir
	if d == "" {
		d = DefaultDir()
	}
	if abs, ok := f.dirs.Load(d); ok {
		return abs.(string), nil
	}
	abs, err := filepath.Abs(d)
	if err != nil {
		return "", fmt.Errorf("filelock: lock directory: %w", err)
	}
	if err := os.MkdirAll(abs, 0o777); err != nil {
		return "", fmt.Errorf("filelock: lock directory: %w", err)
	}
	f.dirs.Store(d, abs)
	return abs, nil
}

func (f *Factory) isClosed() bool { return f.closing.Err() != nil }

// take makes attempts until one gets the lock, in backend.Wait (see
// wait.go); a failed one removes what its attempt kept.
func (f *Factory) take(ctx context.Context, name string, o *lock.Options) (*Holder, time.Duration, error) {
	if err := ctx.Err(); err != nil {
		return nil, 0, err
	}
	if f.isClosed() {
		return nil, 0, lock.ErrClosed
	}
	dir, err := f.dir(o)
	if err != nil {
		return nil, 0, err
	}
	c := &call{f: f, ctx: ctx, name: name, dir: dir, esc: backend.Escape(name), o: o, limit: o.Limit(), ttl: ttlOf(o), renew: !o.NoAutoRenew}
	a := newAttempt(c)
	w := &waiter{dir: dir, esc: c.esc}
	h, waited, err := backend.Wait(ctx, w.waiting(o, f.closing.Done()), func() (*Holder, time.Duration, error) {
		if !w.turn() {
			return nil, w.hint(time.Time{}), ErrLocked // others of this process wait ahead
		}
		h, retryAt, err := c.try(a, w.Close)
		return h, w.hint(retryAt), err
	})
	if err != nil {
		a.giveUp(c)
	}
	return h, waited, err
}

// WithLock runs fn while holding name; see lock.WithLock.
func (f *Factory) WithLock(ctx context.Context, name string, fn func(ctx context.Context) error, opts ...Option) error {
	return lock.WithLock(ctx, f.AsLocker(opts...), name, fn)
}

// AsLocker returns the factory as a lock.Locker whose every Acquire uses
// opts. Its holders are *Holder values.
func (f *Factory) AsLocker(opts ...Option) lock.Locker {
	return backend.Locker(&f.cfg, opts, f.Acquire)
}

// Close makes every lock held through the factory lost (their markers are
// removed; Err matches ErrLockLost and lock.ErrClosed) and every waiter and later Acquire fail with lock.ErrClosed.
// Once it returns, no background work of the factory touches the directory.
func (f *Factory) Close() error {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return nil
	}
	f.closed = true
	f.stop()
	hs := slices.Collect(maps.Keys(f.held))
	f.mu.Unlock()
	var errs []error
	for _, h := range hs {
		if err := h.closeByFactory(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
