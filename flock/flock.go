// Package flock is a lock backend built on the kernel's file locks
// (flock(2) on Unix, LockFileEx on Windows): the simplest correct choice
// when every contender runs on one host.
//
// Each name is a lock file in a directory (WithDir). A holder keeps its own
// open file locked, so two Acquires of a name conflict whether they come
// from two processes or from one; the kernel frees the lock the moment the
// holder's process ends, SIGKILL included. There is no lease to size and
// nothing to renew. Tokens are kept in the lock file and survive restarts;
// files stay until Factory.Sweep (or WithSweepAfter) removes them safely.
//
// The guide describes the files, waiting, loss, the assumptions and the
// failure modes: https://github.com/ubgo/lock/blob/main/docs/guides/flock.md
package flock

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"time"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/backend"
)

// Errors, matching the root sentinels with errors.Is.
var (
	ErrLocked   = fmt.Errorf("flock: %w", lock.ErrLocked)
	ErrLockLost = fmt.Errorf("flock: %w", lock.ErrLockLost)
)

const backendName = "flock"

// Factory acquires locks in a directory. Factories, and processes, that
// use the same directory contend for the same names.
type Factory struct {
	cfg   backend.Config
	check time.Duration // WithCheckInterval
	dir   string        // cfg.Options.Dir resolved, or its error in cfg.Err

	ctx    context.Context // cancelled by Close: ends waits and sweeps
	cancel context.CancelFunc
	wg     sync.WaitGroup // background sweeps

	mu     sync.Mutex
	held   map[*Holder]struct{}
	timer  *time.Timer // verifies held files; nil when none is pending
	closed bool
}

// NewFactory returns a factory whose options are the defaults for every
// call. An invalid option is reported by the first Acquire.
func NewFactory(opts ...Option) *Factory {
	ctx, cancel := context.WithCancel(context.Background())
	f := &Factory{cfg: backend.NewConfig(backendName, opts, checkPermits), ctx: ctx, cancel: cancel, held: map[*Holder]struct{}{}}
	f.check = checkInterval(&f.cfg.Options)
	if f.cfg.Err == nil {
		var err error
		if f.dir, err = resolveDir(f.cfg.Options.Dir); err != nil {
			f.cfg.Fail(err)
		}
	}
	return f
}

// Err returns the error of the factory's options, which every Acquire
// also returns; nil when the factory is usable. Check it at start-up.
func (f *Factory) Err() error { return f.cfg.Err }

// Dir is the directory of the factory's lock files.
func (f *Factory) Dir() string {
	if f.dir == "" {
		dir, _ := resolveDir(f.cfg.Options.Dir)
		return dir
	}
	return f.dir
}

// dirOf is the resolved directory of a call.
func (f *Factory) dirOf(o *lock.Options) (string, error) {
	if o.Dir == f.cfg.Options.Dir && f.dir != "" {
		return f.dir, nil
	}
	dir, err := resolveDir(o.Dir)
	if err != nil {
		return "", fmt.Errorf("flock: %w", err)
	}
	return dir, nil
}

func resolveDir(dir string) (string, error) {
	if dir == "" {
		dir = DefaultDir()
	}
	return filepath.Abs(dir)
}

// Acquire takes name. On contention it returns an error matching ErrLocked
// at once, or with WithWait waits until the lock is free or ctx ends.
func (f *Factory) Acquire(ctx context.Context, name string, opts ...Option) (*Holder, error) {
	start := time.Now()
	o, err := f.cfg.Resolve(name, opts, checkPermits)
	return backend.Take(ctx, backend.Call{Backend: backendName, Name: name, Locked: ErrLocked, Start: start}, &o, err, func(ctx context.Context) (*Holder, time.Duration, error) {
		return f.take(ctx, name, &o)
	})
}

// WithLock runs fn while holding name; see lock.WithLock. The context fn
// gets is cancelled if the lock is lost (the factory is closed, or the
// lock file was deleted behind its back).
func (f *Factory) WithLock(ctx context.Context, name string, fn func(ctx context.Context) error, opts ...Option) error {
	return lock.WithLock(ctx, f.AsLocker(opts...), name, fn)
}

// AsLocker returns the factory as a lock.Locker whose every Acquire uses
// opts. Its holders are *Holder values.
func (f *Factory) AsLocker(opts ...Option) lock.Locker {
	return backend.Locker(&f.cfg, opts, f.Acquire)
}

// Close makes every lock held through the factory lost (its files are
// closed, so the kernel frees them; Err matches ErrLockLost and
// lock.ErrClosed), fails waiting and later Acquires with
// lock.ErrClosed, and waits for a sweep it started to stop.
func (f *Factory) Close() error {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return nil
	}
	f.closed = true
	f.cancel()
	held := make([]*Holder, 0, len(f.held))
	for h := range f.held {
		held = append(held, h)
	}
	if f.timer != nil {
		f.timer.Stop()
	}
	f.mu.Unlock()
	closed := fmt.Errorf("%w: %w", ErrLockLost, lock.ErrClosed)
	for _, h := range held {
		h.lose(closed)
	}
	f.wg.Wait()
	return nil
}

// take makes attempts until one gets the lock, in backend.Wait. The
// attempt keeps its descriptors open from one try to the next, so a
// waiter's retries close no file (see wait.go).
func (f *Factory) take(ctx context.Context, name string, o *lock.Options) (*Holder, time.Duration, error) {
	if err := ctx.Err(); err != nil {
		return nil, 0, err
	}
	if f.ctx.Err() != nil {
		return nil, 0, lock.ErrClosed
	}
	dir, err := f.dirOf(o)
	if err != nil {
		return nil, 0, err
	}
	c := newCall(dir, backend.Escape(name))
	c.f, c.ctx, c.name, c.o, c.limit = f, ctx, name, o, o.Limit()
	f.autoSweep(dir, sweepAfter(o))

	a := newAttempt(c)
	defer a.close()
	var w *waiter // only a call that waits subscribes
	if o.Wait {
		w = &waiter{dir: dir, esc: c.esc}
	}
	return backend.Wait(ctx, w.waiting(f.ctx.Done()), func() (*Holder, time.Duration, error) {
		if !w.turn() {
			return nil, w.hint(), ErrLocked // others of this process wait ahead
		}
		h, err := c.try(a)
		if err == nil {
			if err = f.admit(h); err != nil {
				h.closeFiles(nil)
				h = nil
			}
		}
		return h, w.hint(), err
	})
}

// try makes one attempt. A sweep holds names' files for moments, and a
// name only a sweep held is not busy (see Factory.Sweep): an Acquire that
// does not wait tries again once the sweep lets go (a waiter is woken).
func (c *call) try(a attempt) (*Holder, error) {
	h, err := a.try(c)
	for swept := 0; errors.Is(err, ErrLocked) && !c.o.Wait && swept < sweepRetries && afterSweep(c.ctx, c.dir); swept++ {
		h, err = a.try(c)
	}
	return h, err
}

// Lock is the single-name form: flock.New(name, opts...).Acquire(ctx).
type Lock struct {
	f    *Factory
	name string
}

// New returns the lock for name with opts as its defaults. A bad name or
// option is reported by Acquire.
func New(name string, opts ...Option) *Lock { return &Lock{f: NewFactory(opts...), name: name} }

// Name is the lock's name.
func (l *Lock) Name() string { return l.name }

// Acquire takes the lock; see Factory.Acquire.
func (l *Lock) Acquire(ctx context.Context, opts ...Option) (*Holder, error) {
	return l.f.Acquire(ctx, l.name, opts...)
}

// WithLock runs fn while holding the lock; see Factory.WithLock.
func (l *Lock) WithLock(ctx context.Context, fn func(ctx context.Context) error, opts ...Option) error {
	return l.f.WithLock(ctx, l.name, fn, opts...)
}

// Inspect reports who holds the lock; see Factory.Inspect.
func (l *Lock) Inspect(ctx context.Context) (lock.Info, error) { return l.f.Inspect(ctx, l.name) }

// Close makes a held lock lost and fails later Acquires; see
// Factory.Close. A Lock that is released and dropped needs no Close.
func (l *Lock) Close() error { return l.f.Close() }
