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

	"golang.org/x/sys/unix"

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
		return f.take(ctx, name, &o, !o.NoAutoRenew)
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

func (f *Factory) take(ctx context.Context, name string, o *lock.Options, renew bool) (*Holder, time.Duration, error) {
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
	esc := backend.Escape(name)
	var w *want
	if o.Wait && !o.Shared && o.Limit() == 1 {
		w = &want{} // a writer that waits keeps new readers out
	}
	h, waited, err := f.wait(ctx, o, dir, esc, func() (*Holder, time.Time, error) {
		return f.try(ctx, dir, name, esc, o, renew, w)
	})
	if err != nil && w != nil {
		w.drop(ctx, dir, esc)
	}
	return h, waited, err
}

// try makes one attempt under the name's guard. On contention it returns
// ErrLocked and, when known, the time the earliest live marker expires (or
// w's intent is due to be rewritten). w is the intent of an exclusive
// Acquire that waits, nil for others.
func (f *Factory) try(ctx context.Context, dir, name, esc string, o *lock.Options, renew bool, w *want) (*Holder, time.Time, error) {
	g, err := lockGuard(ctx, dir, esc)
	if err != nil {
		return nil, time.Time{}, err
	}
	defer g.unlock()
	c := readCounter(g.fd)
	limit := o.Limit()
	ttl := ttlOf(o)
	j := &judge{log: backend.Log(o), name: name, ttl: ttl, now: time.Now()}
	mismatch := func(held int) error {
		return fmt.Errorf("filelock: %w: %q is held with limit %d, caller asked for %d", lock.ErrLimitMismatch, name, held, limit)
	}

	// A stored limit that differs matters only while a permit under it is
	// held; if none is, the new limit replaces it.
	readers := c.readers
	if c.limit != 0 && c.limit != limit {
		for _, p := range heldPaths(dir, esc, c) {
			_, live, _, err := j.examine(p)
			if err != nil {
				return nil, time.Time{}, err
			}
			if live {
				return nil, time.Time{}, mismatch(c.limit)
			}
		}
		readers = 0
	}
	if c.limit == 0 {
		// No usable counter: every marker of the name, in whatever layout
		// and slot, says the limit it was taken under; slot markers taken
		// with limit 1 are shared holders'.
		paths, err := markerFiles(dir, esc)
		if err != nil {
			return nil, time.Time{}, err
		}
		for _, p := range paths {
			m, live, _, err := j.examine(p)
			if err != nil {
				return nil, time.Time{}, err
			}
			if live && m != nil && m.Limit != limit {
				return nil, time.Time{}, mismatch(m.Limit)
			}
			readers = max(readers, slotOf(p)+1)
		}
	}

	free, slot := "", -1
	var retryAt time.Time
	held := func(expires time.Time) (*Holder, time.Time, error) {
		if retryAt.IsZero() || expires.Before(retryAt) {
			retryAt = expires
		}
		if w != nil {
			if err := w.hold(j, dir, esc, o); err != nil {
				return nil, time.Time{}, err
			}
			if retryAt.IsZero() || !w.due.IsZero() && w.due.Before(retryAt) {
				retryAt = w.due
			}
		}
		return nil, retryAt, ErrLocked
	}
	if limit > 1 {
		for i, p := range markerPaths(dir, esc, limit) {
			m, live, expires, err := j.examine(p)
			if err != nil {
				return nil, time.Time{}, err
			}
			if !live {
				if free == "" {
					free, slot = p, i
					if c.valid && c.limit == limit {
						break // the counter is sound: no need to see every token
					}
				}
				continue
			}
			if m != nil && m.Limit != 0 && m.Limit != limit {
				return nil, time.Time{}, mismatch(m.Limit)
			}
			if retryAt.IsZero() || expires.Before(retryAt) {
				retryAt = expires
			}
		}
		if free == "" {
			return nil, retryAt, ErrLocked
		}
		readers = 0
	} else {
		// A mutex, or a name taken shared: an exclusive holder's marker
		// <esc>.lock, shared holders' in reader slots <esc>.<i>.lock.
		_, live, expires, err := j.examine(mutexPath(dir, esc))
		if err != nil {
			return nil, time.Time{}, err
		}
		if live {
			return held(expires)
		}
		if o.Shared {
			// Writer preference: the intent of a writer that waits keeps
			// new readers out. A reader takes the lowest free slot.
			_, live, expires, err := j.examine(wantPath(dir, esc))
			if err != nil {
				return nil, time.Time{}, err
			}
			if live {
				return held(expires)
			}
			for i := 0; free == ""; i++ {
				p := slotPath(dir, esc, i)
				m, live, _, err := j.examine(p)
				if err != nil {
					return nil, time.Time{}, err
				}
				if !live {
					free, slot = p, i
				} else if m != nil && m.Limit > 1 {
					return nil, time.Time{}, mismatch(m.Limit)
				}
			}
			readers = max(readers, slot+1)
		} else {
			for _, p := range slotPaths(dir, esc, readers) {
				_, live, expires, err := j.examine(p)
				if err != nil {
					return nil, time.Time{}, err
				}
				if live {
					return held(expires)
				}
			}
			free, readers = mutexPath(dir, esc), 0
		}
	}

	token := nextToken(c, j.seen)
	id := self()
	now := time.Now()
	h := &Holder{
		f: f, name: name, esc: esc, dir: dir, path: free, token: token, ttl: ttl, renew: renew,
		opts: o, state: backend.NewState(), ctx: context.WithoutCancel(ctx), since: now,
	}
	h.m = marker{
		Name: name, Token: token, Nonce: newNonce(), PID: id.pid, Start: id.start, StartTicks: id.ticks,
		Host: id.host, BootID: id.bootID, PIDNS: id.pidNS, TimeNS: id.timeNS,
		Acquired: now, Refreshed: now, Expires: now.Add(ttl), StaleAfter: ttl,
		Limit: limit, Slot: max(slot, 0), Shared: o.Shared, Owner: o.Owner, Meta: maps.Clone(o.Metadata),
	}
	data := h.m.encode()
	if len(data) > maxMarker {
		return nil, time.Time{}, fmt.Errorf("filelock: %w: owner and metadata make a marker of %d bytes, over %d", lock.ErrInvalidOption, len(data), maxMarker)
	}
	put := putCounter
	if o.Shared && slot+1 > c.readers {
		put = writeCounter // see counter.readers
	}
	if err := put(g.fd, token, limit, readers); err != nil {
		return nil, time.Time{}, fmt.Errorf("filelock: write counter: %w", err)
	}
	tmp := tempPath(dir, esc, newNonce()[:16])
	if err := writeTemp(tmp, data); err != nil {
		return nil, time.Time{}, fmt.Errorf("filelock: write marker: %w", err)
	}
	err = unix.Link(tmp, free)
	unix.Unlink(tmp)
	if err == unix.EEXIST {
		// Only a writer that ignores the guard can get here.
		return nil, retryAt, ErrLocked
	}
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("filelock: publish marker: %w", err)
	}
	if w != nil {
		w.dropLocked(dir, esc) // readers that come now wait for h
	}
	h.mu.Lock()
	err = f.register(h)
	if err == nil {
		h.startLocked(now)
		h.state.Bound(o, ErrLockLost, nil, h.end)
	}
	h.mu.Unlock()
	if err != nil {
		unix.Unlink(free)
		return nil, time.Time{}, err
	}
	return h, time.Time{}, nil
}

func (f *Factory) register(h *Holder) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return lock.ErrClosed
	}
	f.held[h] = struct{}{}
	return nil
}

func (f *Factory) unregister(h *Holder) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.held, h)
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
