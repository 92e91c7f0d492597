// Package pglock is a lock backend on PostgreSQL session advisory locks,
// through a pgxpool.Pool: a lock is held by one of the Factory's database
// sessions and freed by Postgres itself when that session ends, so a
// crashed holder never leaves a stuck lock and no TTL has to be sized.
// It offers mutexes, semaphores (WithMaxConcurrent), shared locks
// (WithShared), waiting woken by the release, fencing tokens from a
// database counter, locks inside a transaction (AcquireInTx), and a
// durable Fence and Ledger in two tables.
//
// How it works, what it stores, how fast a loss is noticed, when exclusion
// holds and how it behaves behind PgBouncer are in the guide:
// https://github.com/ubgo/lock/blob/main/docs/guides/pglock.md
package pglock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/ubgo/lock"
	"github.com/ubgo/lock/backend"
)

// Errors, matching the root sentinels with errors.Is where they have one.
var (
	ErrLocked   = fmt.Errorf("pglock: %w", lock.ErrLocked)
	ErrLockLost = fmt.Errorf("pglock: %w", lock.ErrLockLost)
	// ErrPoolExhausted: the factory needed a new lock session or listener
	// and the pool gave no connection within WithConnectTimeout, every one
	// held by others. A server that does not answer (an idle connection's
	// ping, or a new connection, got no reply) is not this: its error says
	// "no answer from the server".
	ErrPoolExhausted = errors.New("pglock: no pool connection for a lock session")
	// ErrSessionChanged: a transaction-mode pooler is in the way. The
	// factory's first Acquire refuses one it detects, before any lock is
	// taken; a lock session that later answers from another backend than
	// the one it started on is closed, and its holders lose their locks
	// with an error matching both this and ErrLockLost. Either way every
	// later Acquire of the factory fails with it. AcquireInTx still works.
	ErrSessionChanged = errors.New("pglock: the backend of a lock session changed; session advisory locks need a session-mode connection (is a transaction-mode pooler such as PgBouncer in between?)")
	// ErrKeyCollision: two different names map to the same advisory key
	// (rare: keys are 64-bit hashes, see the guide); use another name or
	// prefix.
	ErrKeyCollision = errors.New("pglock: two names map to the same advisory key")
)

const backendName = "pglock"

// Factory hands out locks held on its own lock sessions. Create one per
// process (or per pool) and share it; Close it when done.
type Factory struct {
	pool *pgxpool.Pool
	cfg  backend.Config
	set  settings
	st   *statements

	sessions []*session
	waits    *waitSessions // sessions a name's first waiter blocks on (see wait.go)
	lis      *listener
	life     context.Context // cancelled by Close
	end      context.CancelFunc

	setupMu   sync.Mutex
	setupDone bool
	refused   error // the server cannot hold session locks (see setup); guarded by setupMu
	txReady   bool  // AcquireInTx's setup is done (see txSetup); guarded by setupMu

	mu      sync.Mutex
	closed  bool
	entries map[int64]*entry // the in-process table: names in use, by mutex key
	health  *time.Timer
	busy    map[int64]bool // mutex keys contended here lately (see queued)

	epoch atomic.Int64 // the newest committed token epoch seen; 0: none yet
	open  atomic.Int32 // lock sessions connected
}

// validToken reports whether a counter value lies in the range of the
// newest committed epoch this factory has seen. A value in the range of a
// committed epoch was handed out after that epoch began and before any
// later one, and is above every token of earlier epochs.
func (f *Factory) validToken(v int64) bool {
	e := f.epoch.Load()
	return e > 0 && v > e<<32 && v < e<<32+1<<31
}

func (f *Factory) seeEpoch(e int64) {
	for {
		old := f.epoch.Load()
		if e <= old || f.epoch.CompareAndSwap(old, e) {
			return
		}
	}
}

// entry is the in-process state of one name while it is in use (held, or
// being acquired): who of this factory holds which permit, and who waits.
// Its maps and queue are guarded by Factory.mu.
type entry struct {
	prefix, name string
	keys         keys
	limit        int                  // the limit of the current local holders
	held         map[int]*Holder      // by slot
	readers      map[*Holder]struct{} // shared holders (WithShared), beside no held
	busy         chan struct{}        // one local acquire statement at a time
	refs         int                  // holders and Acquire calls using it
	queue        []*waiter            // this factory's waiters, first come first (see wait.go)
}

type keys struct{ mutex, mark, waiters, limit, intent int64 }

func keysOf(prefix, name string) keys {
	return keys{
		mutex:   advisoryKey(kindMutex, prefix, name, -1),
		mark:    advisoryKey(kindSemMark, prefix, name, -1),
		waiters: advisoryKey(kindWaiters, prefix, name, -1),
		limit:   advisoryKey(kindLimit, prefix, name, -1),
		intent:  advisoryKey(kindIntent, prefix, name, -1),
	}
}

// NewFactory returns a factory whose locks are held on sessions taken from
// pool; opts are the defaults of every call. Nothing is opened until the
// first Acquire, which also reports an invalid option or a nil pool.
func NewFactory(pool *pgxpool.Pool, opts ...Option) *Factory {
	cfg := backend.NewConfig(backendName, opts, checkCall)
	if pool == nil {
		cfg.Fail(fmt.Errorf("%w: nil *pgxpool.Pool", lock.ErrInvalidOption))
	}
	set := factorySettings(&cfg.Options)
	if set.appName == "" {
		set.appName = "pglock"
		if pool != nil {
			if app := pool.Config().ConnConfig.RuntimeParams["application_name"]; app != "" {
				set.appName = app + "/pglock"
			}
		}
	}
	f := &Factory{
		pool: pool, cfg: cfg, set: set, st: newStatements(set.schema),
		entries: map[int64]*entry{}, busy: map[int64]bool{},
	}
	f.life, f.end = context.WithCancel(context.Background())
	for i := 0; i < set.sessions; i++ {
		f.sessions = append(f.sessions, newSession(f, i))
	}
	f.waits = &waitSessions{poll: set.poll}
	for i := 0; i < set.waitSessions; i++ {
		f.waits.all = append(f.waits.all, newSession(f, set.sessions+i))
	}
	f.lis = newListener(f)
	return f
}

// Err returns the error of the factory's options (or a nil pool), which
// every Acquire also returns; nil when the factory is usable. Check it at
// start-up.
func (f *Factory) Err() error { return f.cfg.Err }

// Acquire takes name. On contention it returns an error matching ErrLocked
// at once, or with WithWait waits until a permit is free or ctx ends.
// ctx bounds the wait for a lock session too; once the statement is sent it
// runs to completion (bounded by WithStatementTimeout), so a cancelled ctx
// never leaves the result unknown.
func (f *Factory) Acquire(ctx context.Context, name string, opts ...Option) (*Holder, error) {
	start := time.Now()
	o, err := f.cfg.Resolve(name, opts, checkCall)
	return backend.Take(ctx, backend.Call{Backend: backendName, Name: name, Locked: ErrLocked, Start: start, Probe: f.probe}, &o, err, func(ctx context.Context) (*Holder, time.Duration, error) {
		return f.take(ctx, name, &o)
	})
}

// probe fails when Postgres does not answer.
func (f *Factory) probe(ctx context.Context) error {
	if err := f.pool.Ping(ctx); err != nil {
		return fmt.Errorf("pglock: %w", err)
	}
	return nil
}

// WithLock runs fn while holding name; see lock.WithLock. fn's context is
// cancelled when the lock is lost.
func (f *Factory) WithLock(ctx context.Context, name string, fn func(ctx context.Context) error, opts ...Option) error {
	return lock.WithLock(ctx, f.AsLocker(opts...), name, fn)
}

// AsLocker returns the factory as a lock.Locker whose every Acquire uses
// opts. Its holders are *Holder values.
func (f *Factory) AsLocker(opts ...Option) lock.Locker {
	return backend.Locker(&f.cfg, opts, f.Acquire)
}

// Close releases everything the factory started: its lock sessions are
// closed (so Postgres frees their locks and every holder loses its lock),
// waiters and later calls fail with lock.ErrClosed, and the listener
// connection is closed.
func (f *Factory) Close() error {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return nil
	}
	f.closed = true
	f.end()
	if f.health != nil {
		f.health.Stop()
	}
	f.mu.Unlock()
	f.lis.close()
	for _, s := range f.all() {
		s.close()
	}
	return nil
}

// all is every session of the factory: lock sessions, then wait sessions.
func (f *Factory) all() []*session { return slices.Concat(f.sessions, f.waits.all) }

// ref finds or makes the entry of a name and counts a user of it.
func (f *Factory) ref(prefix, name string) (*entry, error) {
	k := keysOf(prefix, name)
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return nil, lock.ErrClosed
	}
	e := f.entries[k.mutex]
	switch {
	case e == nil:
		e = &entry{prefix: prefix, name: name, keys: k, held: map[int]*Holder{}, readers: map[*Holder]struct{}{}, busy: make(chan struct{}, 1)}
		f.entries[k.mutex] = e
	case e.prefix != prefix || e.name != name:
		return nil, fmt.Errorf("%w: %q and %q", ErrKeyCollision, e.name, name)
	}
	e.refs++
	return e, nil
}

func (f *Factory) isClosed() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.closed
}

func (f *Factory) unref(e *entry) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.unrefLocked(e)
}

func (f *Factory) unrefLocked(e *entry) {
	e.refs--
	if e.refs == 0 {
		delete(f.entries, e.keys.mutex)
	}
}

// session is the lock session of a name: the one its mutex key picks.
func (f *Factory) session(k keys) *session {
	return f.sessions[uint64(k.mutex)%uint64(len(f.sessions))]
}

// call is one Acquire of a name, once its options are resolved: what its
// attempts and its waiter share.
type call struct {
	f   *Factory
	e   *entry
	o   *lock.Options
	s   *session        // the name's lock session
	ctx context.Context // the Acquire's
}

// take makes attempts at name through backend.Wait, whose Subscription is
// a waiter (see wait.go). A waiter queues behind this factory's earlier
// waiters of the name; so does, at once, one that would find the name
// held: behind waiters, or at a mutex or a shared name contended here
// lately, whose first attempt then waits in Postgres's queue.
func (f *Factory) take(ctx context.Context, name string, o *lock.Options) (*Holder, time.Duration, error) {
	if err := ctx.Err(); err != nil {
		return nil, 0, err
	}
	e, err := f.ref(o.KeyPrefix, name)
	if err != nil {
		return nil, 0, err
	}
	defer f.unref(e)
	c := &call{f: f, e: e, o: o, s: f.session(e.keys), ctx: ctx}
	queued := o.Wait && f.queued(e, o.Limit() == 1)
	var w *waiter
	waiting := backend.Waiting{
		Wait: o.Wait, Locked: ErrLocked, Closed: f.life.Done(), Queued: queued,
		MinPoll: f.set.poll, MaxPoll: f.set.poll,
		Subscribe: func() (backend.Subscription, error) {
			w = c.subscribe(queued)
			return w, nil
		},
	}
	return backend.Wait(ctx, waiting, func() (*Holder, time.Duration, error) {
		if w != nil {
			if h, asked, err := w.attempt(); asked || err != nil {
				return h, 0, err
			}
		}
		h, err := c.try()
		return h, 0, err
	})
}
