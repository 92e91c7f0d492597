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
	"iter"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/backend"
	"github.com/ubgo/lock/internal/dirwatch"
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

func validate(o *lock.Options) error {
	if o.TTL != 0 && o.TTL < MinStaleAfter {
		return fmt.Errorf("%w: stale window %v is below the minimum %v", lock.ErrInvalidOption, o.TTL, MinStaleAfter)
	}
	return nil
}

func ttlOf(o *lock.Options) time.Duration {
	if o.TTL == 0 {
		return DefaultStaleAfter
	}
	return o.TTL
}

// margin is how long before its lease runs out a holder that could not
// refresh declares the lock lost, so that it knows before anyone can take
// the marker over.
func margin(ttl time.Duration) time.Duration { return min(ttl/10, 2*time.Second) }

// checkEvery is how often a held marker is read back to notice a takeover
// or removal.
func checkEvery(ttl time.Duration) time.Duration {
	return min(max(ttl/8, 10*time.Millisecond), time.Second)
}

// refreshEvery is how often auto-renewing holders refresh: three tries
// before the lease runs out.
func refreshEvery(ttl time.Duration) time.Duration { return ttl / 3 }

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

// judge decides whether markers are live, removing stale ones unless it
// only inspects.
type judge struct {
	log       *slog.Logger
	name      string
	ttl       time.Duration // for markers too damaged to say their own lease
	now       time.Time
	inspect   bool   // never remove
	seen      uint64 // highest token seen
	reclaimed int
}

// examine reads the marker at path. live reports whether it still holds;
// expires is when its lease runs out. A stale marker is removed (we hold the
// name's guard, so nobody else is judging or replacing it meanwhile).
func (j *judge) examine(path string) (m *marker, live bool, expires time.Time, err error) {
	m, mtime, err := readMarker(path)
	if errors.Is(err, unix.ENOENT) {
		return nil, false, time.Time{}, nil
	}
	if err != nil {
		return nil, false, time.Time{}, fmt.Errorf("filelock: read marker: %w", err)
	}
	var reason string
	if m == nil {
		expires = mtime.Add(j.ttl)
		if j.now.After(expires) {
			reason = "unreadable marker older than the stale window"
		}
	} else {
		expires = m.Expires
		j.seen = max(j.seen, m.Token)
		switch {
		case j.now.After(m.Expires):
			reason = "stale window passed without a refresh"
		case holderGone(m):
			reason = "holder process is gone"
		}
	}
	if reason == "" {
		return m, true, expires, nil
	}
	if j.inspect {
		return m, false, expires, nil
	}
	if err := unix.Unlink(path); err != nil && err != unix.ENOENT {
		return nil, false, time.Time{}, fmt.Errorf("filelock: remove stale marker: %w", err)
	}
	j.reclaimed++
	attrs := []any{slog.String("backend", backendName), slog.String("name", j.name), slog.String("file", path), slog.String("reason", reason)}
	if m != nil {
		attrs = append(attrs, slog.Int("pid", m.PID), slog.String("host", m.Host), slog.Uint64("token", m.Token))
	}
	j.log.Info("filelock: reclaimed stale marker", attrs...)
	return m, false, expires, nil
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

// Inspect reports the live holders of name in the factory's directory,
// reading markers without changing anything. ID is "pid@host", Owner the
// WithOwner value, Metadata the WithMetadata pairs.
func (f *Factory) Inspect(ctx context.Context, name string) (lock.Info, error) {
	if err := lock.ValidateName(name); err != nil {
		return lock.Info{}, err
	}
	if f.cfg.Err != nil {
		return lock.Info{}, f.cfg.Err
	}
	if err := ctx.Err(); err != nil {
		return lock.Info{}, err
	}
	dir, err := f.dir(&f.cfg.Options)
	if err != nil {
		return lock.Info{Name: name}, err
	}
	return f.inspectEsc(dir, backend.Escape(name), name)
}

// inspectEsc reads the live holders of the name whose escaped form is
// esc; name is "" when the caller knows only esc (List), and the name in
// the markers is reported.
func (f *Factory) inspectEsc(dir, esc, name string) (lock.Info, error) {
	info := lock.Info{Name: name}
	paths, err := namePaths(dir, esc)
	if err != nil {
		return info, err
	}
	j := &judge{name: name, ttl: ttlOf(&f.cfg.Options), now: time.Now(), inspect: true}
	for _, p := range paths {
		m, live, expires, err := j.examine(p)
		if err != nil {
			return info, err
		}
		if !live {
			continue
		}
		hi := lock.HolderInfo{Expires: expires}
		limit := 0
		if m != nil {
			hi.Token, hi.ID, hi.Owner, hi.Since, limit = m.Token, fmt.Sprintf("%d@%s", m.PID, m.Host), m.Owner, m.Acquired, m.Limit
			hi.Metadata = maps.Clone(m.Meta)
			if info.Name == "" {
				info.Name = m.Name
			}
		}
		info.Limit = max(info.Limit, limit, 1)
		info.Holders = append(info.Holders, hi)
	}
	sort.Slice(info.Holders, func(i, k int) bool { return info.Holders[i].Token < info.Holders[k].Token })
	return info, nil
}

// List yields the held names in the factory's directory that start with
// prefix, with their live holders as Inspect reports them. The order is
// the directory's, not sorted: the directory is read lock.ListPageSize
// entries at a time, and sorting would need every entry at once. Each
// name is found by its counter file (<esc>.token, which every name that
// was ever taken has) and reported with the name its markers record.
// Waiting is 0: waiters are not recorded.
func (f *Factory) List(ctx context.Context, prefix string) iter.Seq2[lock.Info, error] {
	dir := func() (string, error) {
		if f.cfg.Err != nil {
			return "", f.cfg.Err
		}
		return f.dir(&f.cfg.Options)
	}
	counter := func(file string) (string, bool) {
		esc, kind := classify(file)
		return esc, kind == kindCounter
	}
	return backend.ListDir(ctx, backendName, prefix, dir, counter, func(dir, esc string) (lock.Info, error) {
		return f.inspectEsc(dir, esc, "")
	})
}

// namePaths lists the marker files that exist for esc.
func namePaths(dir, esc string) ([]string, error) {
	fd, err := open(counterPath(dir, esc), unix.O_RDONLY, 0)
	if err == nil {
		c := readCounter(fd)
		unix.Close(fd)
		if c.limit > 0 {
			return heldPaths(dir, esc, c), nil
		}
	}
	return markerFiles(dir, esc) // no counter to say the limit
}

// markerFiles lists the marker files of esc in dir, whatever their layout.
func markerFiles(dir, esc string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("filelock: %w", err)
	}
	var ps []string
	for _, e := range entries {
		if n, kind := classify(e.Name()); n == esc && kind == kindMarker {
			ps = append(ps, filepath.Join(dir, e.Name()))
		}
	}
	return ps, nil
}

// tempAge is the age after which Sweep removes a temporary file.
const tempAge = time.Minute

// Sweep removes the markers in the factory's directory that are provably
// stale — their holder died on this host, or their lease ran out —, the
// intents of waiting writers that are stale the same way, and the
// stale temporary files of writers that crashed. It takes each name's
// guard, so it never races an Acquire, a refresh or a Release. It returns
// how many markers it removed. Acquire reclaims stale markers of the names it takes by
// itself; Sweep is for tidying names nobody asks for any more.
func (f *Factory) Sweep(ctx context.Context) (int, error) {
	if f.cfg.Err != nil {
		return 0, f.cfg.Err
	}
	dir, err := f.dir(&f.cfg.Options)
	if err != nil {
		return 0, err
	}
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil // removed since first use: nothing to sweep
	}
	if err != nil {
		return 0, fmt.Errorf("filelock: %w", err)
	}
	type files struct{ markers, temps []string }
	byName := map[string]*files{}
	for _, e := range entries {
		esc, kind := classify(e.Name())
		if kind != kindMarker && kind != kindWant && kind != kindTemp {
			continue
		}
		fs := byName[esc]
		if fs == nil {
			fs = &files{}
			byName[esc] = fs
		}
		p := filepath.Join(dir, e.Name())
		if kind != kindTemp { // a holder's marker or a waiting writer's intent
			fs.markers = append(fs.markers, p)
		} else {
			fs.temps = append(fs.temps, p)
		}
	}
	n := 0
	var errs []error
	for _, esc := range slices.Sorted(maps.Keys(byName)) {
		if err := ctx.Err(); err != nil {
			return n, err
		}
		fs := byName[esc]
		g, err := lockGuard(ctx, dir, esc)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		j := &judge{log: backend.Log(&f.cfg.Options), name: esc, ttl: ttlOf(&f.cfg.Options), now: time.Now()}
		for _, p := range fs.markers {
			if _, _, _, err := j.examine(p); err != nil {
				errs = append(errs, err)
			}
		}
		// A writer needs its temporary file for milliseconds; one older
		// than tempAge was left by a writer that died.
		for _, p := range fs.temps {
			if st, err := os.Lstat(p); err != nil || time.Since(st.ModTime()) < tempAge {
				continue
			}
			if err := unix.Unlink(p); err != nil && err != unix.ENOENT {
				errs = append(errs, fmt.Errorf("filelock: remove %s: %w", p, err))
			}
		}
		g.unlock()
		if j.reclaimed > 0 {
			dirwatch.Signal(dir, esc)
		}
		n += j.reclaimed
	}
	return n, errors.Join(errs...)
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
