// Package memlock is an in-process lock backend: the one to wire in tests,
// and a correct choice for goroutines of a single process.
//
// It keeps the whole contract of the family — fencing tokens, semaphores
// with checked limits, FIFO waiting, leases with TTL and renewal — and adds
// hooks that let tests drive the failure paths of the code under test:
// ForceLoss makes holders lose their lock, and a ManualClock expires leases
// on demand.
//
// Guide: https://github.com/ubgo/lock/blob/main/docs/guides/memlock.md
package memlock

import (
	"container/list"
	"context"
	"fmt"
	"iter"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/backend"
)

// Errors, matching the root sentinels with errors.Is.
var (
	ErrLocked   = fmt.Errorf("memlock: %w", lock.ErrLocked)
	ErrLockLost = fmt.Errorf("memlock: %w", lock.ErrLockLost)
)

const backendName = "memlock"

// Factory hands out locks kept in its own memory. Two factories never
// contend; share one factory between the parts of a test that should.
type Factory struct {
	cfg   backend.Config
	clock Clock

	mu     sync.Mutex
	names  map[string]*entry
	tokens map[string]uint64 // last token per name, kept for the factory's life
	closed bool
}

type entry struct {
	limit   int
	holders map[*Holder]struct{}
	shared  int       // how many of holders are shared (WithShared)
	waiters list.List // of *waiter, FIFO
}

// fits reports whether a new holder, shared or not, may hold e now beside
// its holders. Waiters are served in order, so a reader that comes while
// a writer waits queues behind it: the writer preference of WithShared.
func (e *entry) fits(shared bool) bool {
	switch {
	case shared:
		return len(e.holders) == e.shared // no exclusive holder
	case e.limit == 1:
		return len(e.holders) == 0
	}
	return len(e.holders) < e.limit
}

type waiter struct {
	limit int
	opts  *lock.Options
	ctx   context.Context
	start time.Time
	grant chan *Holder // buffered 1; receives the holder when granted
}

// NewFactory returns a factory whose options are the defaults for every
// call. An invalid option is reported by the first Acquire.
func NewFactory(opts ...Option) *Factory {
	f := &Factory{cfg: backend.NewConfig(backendName, opts, nil), clock: systemClock{}, names: map[string]*entry{}, tokens: map[string]uint64{}}
	if c, ok := f.cfg.Options.Value(clockKey{}).(Clock); ok {
		f.clock = c
	}
	return f
}

// Acquire takes name. On contention it returns an error matching ErrLocked
// at once, or with WithWait waits in FIFO order until a permit is handed to
// it or ctx ends. With WithShared, shared holders hold together; FIFO order
// makes a reader that comes while a writer waits wait behind it.
func (f *Factory) Acquire(ctx context.Context, name string, opts ...Option) (*Holder, error) {
	start := time.Now()
	o, err := f.cfg.Resolve(name, opts, nil)
	return backend.Take(ctx, backend.Call{Backend: backendName, Name: name, Locked: ErrLocked, Start: start}, &o, err, func(ctx context.Context) (*Holder, time.Duration, error) {
		return f.take(ctx, name, &o)
	})
}

// Err returns the error of the factory's options, which every Acquire
// also returns; nil when the factory is usable. Check it at start-up.
func (f *Factory) Err() error { return f.cfg.Err }

func (f *Factory) take(ctx context.Context, name string, o *lock.Options) (*Holder, time.Duration, error) {
	if err := ctx.Err(); err != nil {
		return nil, 0, err
	}
	limit := o.Limit()
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return nil, 0, lock.ErrClosed
	}
	e := f.names[name]
	if e == nil {
		e = &entry{limit: limit, holders: map[*Holder]struct{}{}}
		f.names[name] = e
	}
	if e.limit != limit {
		f.mu.Unlock()
		return nil, 0, fmt.Errorf("memlock: %w: %q has limit %d, caller asked for %d", lock.ErrLimitMismatch, name, e.limit, limit)
	}
	if e.fits(o.Shared) && e.waiters.Len() == 0 {
		h := f.grantLocked(ctx, name, e, o)
		f.mu.Unlock()
		return h, 0, nil
	}
	if !o.Wait {
		f.mu.Unlock()
		return nil, 0, ErrLocked
	}
	w := &waiter{limit: limit, opts: o, ctx: ctx, start: time.Now(), grant: make(chan *Holder, 1)}
	el := e.waiters.PushBack(w)
	f.mu.Unlock()

	select {
	case h := <-w.grant:
		if h == nil {
			return nil, time.Since(w.start), lock.ErrClosed
		}
		return h, time.Since(w.start), nil
	case <-ctx.Done():
	}
	f.mu.Lock()
	select {
	case h := <-w.grant: // granted while we gave up: hand it on
		f.mu.Unlock()
		if h != nil {
			h.Release()
		}
	default:
		// Readers queued behind a writer that gives up may fit now.
		e.waiters.Remove(el)
		f.serveLocked(name, e)
		f.mu.Unlock()
	}
	return nil, time.Since(w.start), lock.NewWaitError(ErrLocked, ctx)
}

// grantLocked makes a new holder of name. f.mu is held.
func (f *Factory) grantLocked(ctx context.Context, name string, e *entry, o *lock.Options) *Holder {
	f.tokens[name]++
	h := &Holder{
		f: f, name: name, e: e, opts: o, token: f.tokens[name],
		state: backend.NewState(), ctx: context.WithoutCancel(ctx), since: f.clock.Now(),
	}
	e.holders[h] = struct{}{}
	if o.Shared {
		e.shared++
	}
	if o.TTL > 0 && o.NoAutoRenew {
		h.expires = h.since.Add(o.TTL)
		h.stop = f.clock.AfterFunc(o.TTL, h.expire)
	}
	h.state.Bound(o, ErrLockLost, f.clock.AfterFunc, h.lose)
	return h
}

// removeLocked takes h out of its entry, ends its state — released, or
// lost with loss if that is not nil — and hands the permit to the next
// waiter. Done closes before the hand-off, so the old holder learns of the
// loss before a successor holds, as in every backend. f.mu is held.
func (f *Factory) removeLocked(h *Holder, loss error) bool {
	if _, ok := h.e.holders[h]; !ok {
		return false
	}
	delete(h.e.holders, h)
	if h.opts.Shared {
		h.e.shared--
	}
	if h.stop != nil {
		h.stop()
	}
	if loss != nil {
		h.state.Lose(loss)
	} else {
		h.state.End()
	}
	f.serveLocked(h.name, h.e)
	return true
}

// serveLocked grants e's waiters, in order, as long as the first fits.
// f.mu is held.
func (f *Factory) serveLocked(name string, e *entry) {
	for e.waiters.Len() > 0 && e.fits(e.waiters.Front().Value.(*waiter).opts.Shared) {
		w := e.waiters.Remove(e.waiters.Front()).(*waiter)
		w.grant <- f.grantLocked(w.ctx, name, e, w.opts)
	}
	f.dropIfIdleLocked(name, e)
}

func (f *Factory) dropIfIdleLocked(name string, e *entry) {
	if len(e.holders) == 0 && e.waiters.Len() == 0 && f.names[name] == e {
		delete(f.names, name)
	}
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

// Inspect reports the current holders of name and how many Acquires wait
// for it.
func (f *Factory) Inspect(ctx context.Context, name string) (lock.Info, error) {
	if err := lock.ValidateName(name); err != nil {
		return lock.Info{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.infoLocked(name), nil
}

// infoLocked describes name. f.mu is held.
func (f *Factory) infoLocked(name string) lock.Info {
	info := lock.Info{Name: name}
	e := f.names[name]
	if e == nil {
		return info
	}
	info.Waiting = e.waiters.Len()
	if len(e.holders) == 0 {
		return info
	}
	info.Limit = e.limit
	for h := range e.holders {
		info.Holders = append(info.Holders, lock.HolderInfo{
			Token: h.token, Owner: h.opts.Owner, Since: h.since, Expires: h.expires, Metadata: h.opts.Metadata,
		})
	}
	sort.Slice(info.Holders, func(i, j int) bool { return info.Holders[i].Token < info.Holders[j].Token })
	return info
}

// List yields the names that start with prefix and are held or waited
// for, in byte order, with their holders and waiting counts. The names
// are a snapshot taken when the loop starts (they are in memory anyway);
// each name's state is read as it is reached, and a name freed since is
// skipped.
func (f *Factory) List(ctx context.Context, prefix string) iter.Seq2[lock.Info, error] {
	return func(yield func(lock.Info, error) bool) {
		f.mu.Lock()
		var names []string
		for name := range f.names {
			if strings.HasPrefix(name, prefix) {
				names = append(names, name)
			}
		}
		f.mu.Unlock()
		slices.Sort(names)
		for _, name := range names {
			if err := ctx.Err(); err != nil {
				yield(lock.Info{}, err)
				return
			}
			f.mu.Lock()
			info := f.infoLocked(name)
			f.mu.Unlock()
			if len(info.Holders) == 0 && info.Waiting == 0 {
				continue
			}
			if !yield(info, nil) {
				return
			}
		}
	}
}

// ForceLoss makes every current holder of name lose its lock, as an expired
// lease or a dead session would: Done closes, Err matches ErrLockLost,
// WithLock's context is cancelled, and waiters are granted the freed
// permits. It returns how many holders lost the lock.
func (f *Factory) ForceLoss(name string) int {
	f.mu.Lock()
	var lost []*Holder
	if e := f.names[name]; e != nil {
		for h := range e.holders {
			lost = append(lost, h)
		}
		for _, h := range lost {
			f.removeLocked(h, backend.Loss(ErrLockLost, lock.ErrRemoved, "taken away (ForceLoss)"))
		}
	}
	f.mu.Unlock()
	for _, h := range lost {
		h.reportLost()
	}
	return len(lost)
}

// Close makes every held lock lost (its Err matches ErrLockLost and
// lock.ErrClosed) and every waiter and later Acquire fail with
// lock.ErrClosed.
func (f *Factory) Close() error {
	f.mu.Lock()
	f.closed = true
	var lost []*Holder
	for _, e := range f.names {
		for h := range e.holders {
			lost = append(lost, h)
		}
		for el := e.waiters.Front(); el != nil; el = el.Next() {
			el.Value.(*waiter).grant <- nil
		}
		e.waiters.Init()
		e.holders = map[*Holder]struct{}{}
		e.shared = 0
	}
	clear(f.names)
	f.mu.Unlock()
	closed := fmt.Errorf("%w: %w", ErrLockLost, lock.ErrClosed)
	for _, h := range lost {
		if h.stop != nil {
			h.stop()
		}
		if h.state.Lose(closed) {
			h.reportLost()
		}
	}
	return nil
}

// Waiting reports how many Acquire calls are waiting for name; tests use it
// to know a waiter has queued.
func (f *Factory) Waiting(name string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	if e := f.names[name]; e != nil {
		return e.waiters.Len()
	}
	return 0
}
