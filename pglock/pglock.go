// Package pglock is a lock backend on PostgreSQL session advisory locks:
// the lock is held by a database session and freed by Postgres itself when
// that session ends, so a crashed holder never leaves a stuck lock and no
// TTL has to be sized.
//
// # Design
//
// A Factory owns a small number of dedicated lock sessions (WithSessions,
// default 2), taken from the pool with Acquire + Hijack and never given
// back to it, plus one listener connection while somebody waits. Every lock
// the factory hands out is held on one of these sessions, so ten thousand
// held locks need at most three connections, not ten thousand. Postgres session
// locks are re-entrant, so the factory keeps an in-process table of what its
// sessions hold: two goroutines of one process never both "hold" a name.
//
// Acquire is one round trip on the session (pg_try_advisory_lock and the
// token in one statement; a few more only on a factory's first acquire and
// after a server crash); Release is one round trip (pg_advisory_unlock,
// plus a NOTIFY only when another session waits for the name). Holders
// still held after a few milliseconds are published, in batches and off the
// hot path, to the unlogged pglock_holders table, which Inspect reads.
//
// # Guarantees and assumptions
//
//   - Mutual exclusion holds while every contender talks to the same
//     PostgreSQL primary over session-mode connections. A transaction-mode
//     pooler (PgBouncer pool_mode=transaction) breaks session locks; pglock
//     notices when the backend pid of a lock session changes and treats
//     every lock on it as lost, but cannot detect every such setup.
//   - Tokens come from a counter in the same statement that takes the lock:
//     strictly increasing per name (and across names), durable across
//     client and server restarts (the counter runs in the range of an epoch
//     that is committed before the range is used; a crash moves it to a
//     new epoch), but not across a failover to an asynchronous replica that
//     had not received the latest epoch. A lock lost to a failover is
//     reported as lost, as any ended session is.
//   - Loss: when a lock session ends (server restart, pg_terminate_backend,
//     network cut) every holder on it sees Done closed and Err matching
//     ErrLockLost within WithHealthInterval (default 1s), or at the first
//     failing statement; with the network cut, within the health interval
//     plus WithStatementTimeout (default 5s). WithLock cancels its context.
//   - A session whose unlock failed or whose result is unknown is closed,
//     which frees its locks on the server; it never goes back to the pool.
//   - Names map to 64-bit advisory keys (see the guide for the collision
//     story and how to find a lock in pg_locks).
package pglock

import (
	"context"
	"errors"
	"fmt"
	"strconv"
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
	// and the pool gave no connection within WithConnectTimeout.
	ErrPoolExhausted = errors.New("pglock: no pool connection for a lock session")
	// ErrSessionChanged: a lock session answered from another backend than
	// the one it started on, as behind a transaction-mode pooler. Holders on
	// it lose their locks with an error matching both this and ErrLockLost.
	ErrSessionChanged = errors.New("pglock: the backend of a lock session changed; session advisory locks need a session-mode connection (is a transaction-mode pooler such as PgBouncer in between?)")
	// ErrKeyCollision: two different names map to the same advisory key
	// (probability about 2^-64 per pair); use another name or prefix.
	ErrKeyCollision = errors.New("pglock: two names map to the same advisory key")
)

const backendName = "pglock"

// publishDelay is how long a holder is held before it is written to
// pglock_holders: locks released sooner never cost a write.
const publishDelay = 2 * time.Millisecond

// Factory hands out locks held on its own lock sessions. Create one per
// process (or per pool) and share it; Close it when done.
type Factory struct {
	pool *pgxpool.Pool
	opts lock.Options
	err  error
	cfg  config
	st   *statements

	sessions []*session
	lis      *listener
	closing  chan struct{}

	setupMu   sync.Mutex
	setupDone bool

	mu      sync.Mutex
	closed  bool
	entries map[int64]*entry   // by mutex key: the in-process table
	names   map[nameKey]*entry // the same entries, by name
	idle    int                // entries nobody uses, kept (see maxIdle)
	health  *time.Timer

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

// entry is the in-process state of one name: who of this factory holds
// which permit, and the local waiters' wake-up channel.
type entry struct {
	prefix, name string
	keys         keys
	limit        int             // the limit of the current local holders
	held         map[int]*Holder // by slot
	busy         chan struct{}   // one local acquire statement at a time
	wake         chan struct{}   // made by a local waiter; closed when a local holder releases or loses
	refs         int
}

type nameKey struct{ prefix, name string }

// maxIdle is how many entries nobody uses a factory keeps, so that a name
// used again soon (the usual acquire, release, acquire) needs no hashing
// of its keys and no allocation.
const maxIdle = 256

type keys struct {
	mutex, mark, waiters, limit int64
	payload                     string // the NOTIFY payload: waiters in decimal
}

func keysOf(prefix, name string) keys {
	k := keys{
		mutex:   advisoryKey(kindMutex, prefix, name, -1),
		mark:    advisoryKey(kindSemMark, prefix, name, -1),
		waiters: advisoryKey(kindWaiters, prefix, name, -1),
		limit:   advisoryKey(kindLimit, prefix, name, -1),
	}
	k.payload = strconv.FormatInt(k.waiters, 10)
	return k
}

// NewFactory returns a factory whose locks are held on sessions taken from
// pool; opts are the defaults of every call. Nothing is opened until the
// first Acquire, which also reports an invalid option or a nil pool.
func NewFactory(pool *pgxpool.Pool, opts ...Option) *Factory {
	o, err := lock.Apply(lock.Options{}, opts...)
	if err == nil {
		err = checkCall(&o)
	}
	if err == nil && pool == nil {
		err = errors.New("pglock: NewFactory: nil *pgxpool.Pool")
	}
	cfg := factoryConfig(&o)
	if cfg.appName == "" {
		cfg.appName = "pglock"
		if pool != nil {
			if app := pool.Config().ConnConfig.RuntimeParams["application_name"]; app != "" {
				cfg.appName = app + "/pglock"
			}
		}
	}
	f := &Factory{
		pool: pool, opts: o, err: err, cfg: cfg, st: newStatements(cfg.schema),
		closing: make(chan struct{}), entries: map[int64]*entry{}, names: map[nameKey]*entry{},
	}
	for i := 0; i < cfg.sessions; i++ {
		f.sessions = append(f.sessions, newSession(f, i))
	}
	f.lis = newListener(f)
	return f
}

// Acquire takes name. On contention it returns an error matching ErrLocked
// at once, or with WithWait waits until a permit is free or ctx ends.
// ctx bounds the wait for a lock session too; once the statement is sent it
// runs to completion (bounded by WithStatementTimeout), so a cancelled ctx
// never leaves the result unknown.
func (f *Factory) Acquire(ctx context.Context, name string, opts ...Option) (*Holder, error) {
	start := time.Now()
	o, err := backend.Resolve(f.opts, f.err, name, opts, checkCall)
	var h *Holder
	var wait time.Duration
	if err == nil {
		h, wait, err = f.take(ctx, name, &o)
	}
	return backend.Finish(ctx, backend.Call{Backend: backendName, Name: name, Locked: ErrLocked, Start: start}, &o, h, wait, err)
}

// WithLock runs fn while holding name; see lock.WithLock. fn's context is
// cancelled when the lock is lost.
func (f *Factory) WithLock(ctx context.Context, name string, fn func(ctx context.Context) error, opts ...Option) error {
	return lock.WithLock(ctx, f.AsLocker(opts...), name, fn)
}

// AsLocker returns the factory as a lock.Locker whose every Acquire uses
// opts. Its holders are *Holder values.
func (f *Factory) AsLocker(opts ...Option) lock.Locker {
	return backend.Locker(func(ctx context.Context, name string) (*Holder, error) {
		return f.Acquire(ctx, name, opts...)
	})
}

// ref finds or makes the entry of a name and counts a user of it.
func (f *Factory) ref(prefix, name string) (*entry, error) {
	nk := nameKey{prefix, name}
	f.mu.Lock()
	defer f.mu.Unlock()
	e := f.names[nk]
	if e == nil {
		// Hash outside the lock.
		f.mu.Unlock()
		k := keysOf(prefix, name)
		f.mu.Lock()
		if e = f.names[nk]; e == nil && !f.closed {
			if o := f.entries[k.mutex]; o != nil {
				if o.refs > 0 {
					return nil, fmt.Errorf("%w: %q and %q", ErrKeyCollision, o.name, name)
				}
				delete(f.names, nameKey{o.prefix, o.name}) // idle: forget it
				f.idle--
			}
			e = &entry{prefix: prefix, name: name, keys: k, held: map[int]*Holder{}, busy: make(chan struct{}, 1)}
			f.entries[k.mutex], f.names[nk] = e, e
			f.idle++ // counted as idle until its first user, just below
		}
	}
	if f.closed {
		return nil, lock.ErrClosed
	}
	if e.refs == 0 {
		f.idle--
	}
	e.refs++
	return e, nil
}

func (f *Factory) unref(e *entry) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.unrefLocked(e)
}

func (f *Factory) unrefLocked(e *entry) {
	e.refs--
	if e.refs > 0 || f.names[nameKey{e.prefix, e.name}] != e {
		return
	}
	if f.idle < maxIdle {
		f.idle++
		return
	}
	delete(f.entries, e.keys.mutex)
	delete(f.names, nameKey{e.prefix, e.name})
}

// wakeLocked wakes the local waiters of e. f.mu is held.
func (e *entry) wakeLocked() {
	if e.wake != nil {
		close(e.wake)
		e.wake = nil
	}
}

func (f *Factory) session(k keys) *session {
	return f.sessions[uint64(k.mutex)%uint64(len(f.sessions))]
}

func (f *Factory) take(ctx context.Context, name string, o *lock.Options) (*Holder, time.Duration, error) {
	if err := ctx.Err(); err != nil {
		return nil, 0, err
	}
	e, err := f.ref(o.KeyPrefix, name)
	if err != nil {
		return nil, 0, err
	}
	defer f.unref(e)
	s := f.session(e.keys)
	var (
		w         *waitReg
		waitStart time.Time
		waited    = func() time.Duration {
			if w == nil {
				return 0
			}
			return time.Since(waitStart)
		}
	)
	defer func() {
		if w != nil {
			f.unregisterWaiter(ctx, s, w)
		}
	}()
	var poll *time.Timer
	defer func() {
		if poll != nil {
			poll.Stop()
		}
	}()
	lostOnce := false // the last attempt's session ended under it
	for {
		var wake chan struct{}
		if o.Wait {
			// Taken before the attempt: a release after it closes it.
			f.mu.Lock()
			if e.wake == nil {
				e.wake = make(chan struct{})
			}
			wake = e.wake
			f.mu.Unlock()
		}
		gen := s.generation()
		h, err := f.try(ctx, s, e, o)
		if w != nil && err != nil && ctx.Err() != nil {
			return nil, waited(), lock.NewWaitError(ErrLocked, ctx)
		}
		if o.Wait && err != nil && !errors.Is(err, ErrLocked) && s.generation() != gen && !lostOnce {
			// The session ended under the attempt (terminated, or its
			// connection cut) and Postgres freed all it held: a waiter
			// tries again on the next session, once. A second loss in a
			// row (a session that cannot work: a pooler, a dying server)
			// is returned.
			lostOnce = true
			continue
		}
		lostOnce = false
		if err == nil || !errors.Is(err, ErrLocked) || !o.Wait {
			return h, waited(), err
		}
		if w == nil {
			// Listen, then mark the name as waited for, then try again:
			// a release after the marker is seen sends a notification
			// this factory receives.
			waitStart = time.Now()
			w = &waitReg{key: e.keys.waiters, ch: make(chan struct{}, 1)}
			if err := f.registerWaiter(ctx, s, w); err != nil {
				f.lis.unsubscribe(w)
				w = nil
				if ctx.Err() != nil {
					return nil, time.Since(waitStart), lock.NewWaitError(ErrLocked, ctx)
				}
				return nil, time.Since(waitStart), err
			}
			poll = time.NewTimer(f.cfg.poll)
			continue
		}
		if !f.lis.isRunning() {
			// The listener's connection ended: start another (or poll).
			f.lis.ensure(ctx)
		}
		if s.generation() != w.gen.Load() {
			// The session was replaced, and the marker with it: without a
			// new one, releases elsewhere would not notify.
			if err := f.markWaiter(ctx, s, w); err != nil && ctx.Err() != nil {
				return nil, waited(), lock.NewWaitError(ErrLocked, ctx)
			}
		}
		select {
		case <-wake:
		case <-w.ch:
		case <-poll.C:
			poll.Reset(f.cfg.poll)
		case <-ctx.Done():
			return nil, waited(), lock.NewWaitError(ErrLocked, ctx)
		case <-f.closing:
			return nil, waited(), lock.ErrClosed
		}
	}
}

// try makes one attempt at a permit of e.
func (f *Factory) try(ctx context.Context, s *session, e *entry, o *lock.Options) (*Holder, error) {
	select {
	case e.busy <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	defer func() { <-e.busy }()
	limit := o.Limit()
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return nil, lock.ErrClosed
	}
	if len(e.held) > 0 && e.limit != limit {
		f.mu.Unlock()
		return nil, mismatch(e.name, e.limit, limit)
	}
	localHolders := len(e.held)
	var slots []int
	for i := 0; i < limit; i++ {
		if e.held[i] == nil {
			slots = append(slots, i)
		}
	}
	f.mu.Unlock()
	if len(slots) == 0 {
		return nil, ErrLocked
	}
	var h *Holder
	err := s.do(ctx, true, func(sc *sessionConn) error {
		var err error
		if limit == 1 {
			h, err = f.tryMutex(sc, e, o)
		} else {
			h, err = f.trySemaphore(sc, e, o, slots, localHolders)
		}
		if h != nil {
			f.mu.Lock()
			e.held[h.slot] = h
			e.limit = limit
			e.refs++ // the holder's reference
			f.mu.Unlock()
			sc.s.add(h)
		}
		return err
	})
	return h, err
}

func mismatch(name string, have, want int) error {
	return fmt.Errorf("pglock: %w: %q has limit %d, caller asked for %d", lock.ErrLimitMismatch, name, have, want)
}

func (f *Factory) tryMutex(sc *sessionConn, e *entry, o *lock.Options) (*Holder, error) {
	tok, pid, err := sc.hot(hotAcquire, e.keys.mutex, e.keys.mark)
	if err != nil {
		return nil, sc.cleanup(err, []int64{e.keys.mutex}, 0)
	}
	if err := sc.checkPID(pid); err != nil {
		return nil, err
	}
	if tok > 0 && !f.validToken(tok) {
		if tok, err = sc.newToken(tok); err != nil {
			return nil, sc.unlock(err, []int64{e.keys.mutex}, 0)
		}
	}
	switch {
	case tok > 0:
		return f.newHolder(sc, e, o, e.keys.mutex, 0, 1, tok), nil
	case tok == -1:
		return nil, ErrLocked
	case tok == -2:
		return nil, fmt.Errorf("pglock: %w: %q is held as a semaphore, caller asked for a mutex", lock.ErrLimitMismatch, e.name)
	}
	// The unlock after a failed check did not find the lock: the session
	// is not what we think it is.
	return nil, sc.fail(fmt.Errorf("pglock: unexpected acquire result %d", tok))
}

func (f *Factory) trySemaphore(sc *sessionConn, e *entry, o *lock.Options, slots []int, localHolders int) (*Holder, error) {
	limit := o.Limit()
	keys := make([]int64, len(slots))
	slots32 := make([]int32, len(slots))
	for i, s := range slots {
		keys[i] = advisoryKey(kindSlot, e.prefix, e.name, s)
		slots32[i] = int32(s)
	}
	for attempt := 0; ; attempt++ {
		takeMark := sc.s.marks[e.keys.mark] == 0
		var (
			slot, stored, pid, status *int32
			tok                       *int64
		)
		err := sc.queryRow(f.st.semAcquire, []any{keys, slots32, e.keys.mark, takeMark, e.keys.mutex, e.keys.limit, int32(limit), e.prefix, e.name},
			&slot, &tok, &stored, &pid, &status)
		if err != nil {
			var mark int64
			if takeMark {
				mark = e.keys.mark
			}
			return nil, sc.cleanup(err, keys, mark)
		}
		if err := sc.checkPID(*pid); err != nil {
			return nil, err
		}
		if *status == 0 && !f.validToken(*tok) {
			key := advisoryKey(kindSlot, e.prefix, e.name, int(*slot))
			t, err := sc.newToken(*tok)
			if err != nil {
				var mark int64
				if takeMark {
					mark = e.keys.mark
				}
				return nil, sc.unlock(err, []int64{key}, mark)
			}
			tok = &t
		}
		switch *status {
		case 0:
			sc.s.marks[e.keys.mark]++
			return f.newHolder(sc, e, o, advisoryKey(kindSlot, e.prefix, e.name, int(*slot)), int(*slot), limit, *tok), nil
		case 1:
			return nil, ErrLocked
		case 3:
			return nil, fmt.Errorf("%w: %q and the stored name of its limits row", ErrKeyCollision, e.name)
		case 4:
			return nil, fmt.Errorf("pglock: %w: %q is held as a mutex, caller asked for limit %d", lock.ErrLimitMismatch, e.name, limit)
		}
		// status 2: the stored limit differs. It may change only while
		// nobody holds the name, and never under this factory's own holders.
		have := int(*stored)
		if localHolders > 0 || attempt >= 3 {
			return nil, mismatch(e.name, have, limit)
		}
		all := make([]int64, max(have, limit))
		for i := range all {
			all[i] = advisoryKey(kindSlot, e.prefix, e.name, i)
		}
		var done, pid2 int32
		if err := sc.queryRow(f.st.relimit, []any{all, e.keys.limit, int32(limit), e.prefix, e.name}, &done, &pid2); err != nil {
			return nil, sc.cleanup(err, nil, 0)
		}
		if err := sc.checkPID(pid2); err != nil {
			return nil, err
		}
		switch done {
		case 0:
			// Permits are held: by holders of another limit (a mismatch
			// the next attempt reports again), or by holders of our own
			// limit that another session set meanwhile (the next attempt
			// sees it).
		case 3:
			return nil, fmt.Errorf("%w: %q and the stored name of its limits row", ErrKeyCollision, e.name)
		}
	}
}

func (f *Factory) newHolder(sc *sessionConn, e *entry, o *lock.Options, key int64, slot, limit int, tok int64) *Holder {
	return &Holder{
		f: f, s: sc.s, gen: sc.s.gen, e: e, name: e.name, key: key, slot: slot, limit: limit,
		token: uint64(tok), pid: sc.s.pid, since: time.Now(), opts: o,
		ctx: withoutCancel(sc.caller), state: backend.NewState(),
	}
}

// withoutCancel is context.WithoutCancel, without the allocation when ctx
// has no cancellation to drop.
func withoutCancel(ctx context.Context) context.Context {
	if ctx.Done() == nil {
		return ctx
	}
	return context.WithoutCancel(ctx)
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
	close(f.closing)
	if f.health != nil {
		f.health.Stop()
	}
	f.mu.Unlock()
	f.lis.close()
	for _, s := range f.sessions {
		s.close()
	}
	return nil
}

// Holder is one held lock or semaphore permit.
type Holder struct {
	f     *Factory
	s     *session
	gen   uint64
	e     *entry
	name  string
	key   int64
	slot  int
	limit int
	token uint64
	pid   uint32
	since time.Time
	opts  *lock.Options
	ctx   context.Context // the Acquire context without its cancellation, for reports
	state *backend.State

	relMu  sync.Mutex
	relErr error

	published bool // written to pglock_holders; guarded by the session
}

// Token is the fencing token: strictly increasing per name, taken from a
// durable sequence in the statement that took the lock.
func (h *Holder) Token() uint64 { return h.token }

// Done is closed when the lock is released or lost.
func (h *Holder) Done() <-chan struct{} { return h.state.Done() }

// Err is nil while held or after Release, and matches ErrLockLost once
// lost.
func (h *Holder) Err() error { return h.state.Err() }

// Name is the name the lock was acquired under.
func (h *Holder) Name() string { return h.name }

// BackendPID is the pid of the Postgres backend (the lock session) that
// holds the lock, as pg_locks and pg_stat_activity show it.
func (h *Holder) BackendPID() uint32 { return h.pid }

// Release gives the lock up in one statement on its session. It is
// idempotent and runs on a context of its own (backend.ReleaseContext).
// If the unlock fails or its result is unknown, the session is closed, which
// frees the lock on the server (and makes the other holders on that session
// lose theirs). After a loss Release returns an error matching ErrLockLost.
func (h *Holder) Release() error {
	h.relMu.Lock()
	defer h.relMu.Unlock()
	if h.state.Ended() {
		if err := h.state.Err(); err != nil {
			return err
		}
		return h.relErr
	}
	var res int32
	err := h.release(func(sc *sessionConn) error {
		if sc.s.gen != h.gen {
			return nil // the session ended; the holder was told
		}
		var pid int32
		var err error
		payload := h.e.keys.payload
		switch {
		case h.limit > 1:
			sc.s.marks[h.e.keys.mark]--
			drop := sc.s.marks[h.e.keys.mark] <= 0
			if drop {
				delete(sc.s.marks, h.e.keys.mark)
			}
			var tok *int64
			if h.published {
				t := int64(h.token)
				tok = &t
			}
			var ok bool
			err = sc.queryRow(h.f.st.semRelease, []any{h.key, h.e.keys.mark, drop, h.e.keys.waiters, payload, tok}, &ok, &pid)
			if ok {
				res = 1
			}
		case h.published:
			var v int64
			v, pid, err = sc.hot(hotReleasePub, h.key, h.e.keys.waiters, int64(h.token))
			res = int32(v)
		default:
			var v int64
			v, pid, err = sc.hot(hotRelease, h.key, h.e.keys.waiters)
			res = int32(v)
		}
		if err != nil {
			// Unknown or failed: close the session, which frees the lock.
			return sc.fail(fmt.Errorf("pglock: release of %q: %w", h.name, err))
		}
		if err := sc.checkPID(pid); err != nil {
			return err
		}
		sc.s.remove(h)
		return nil
	})
	switch {
	case h.state.Ended(): // lost before or while releasing
		if err := h.state.Err(); err != nil {
			return err
		}
		return h.relErr
	case err != nil && !h.s.holds(h):
		// The session was closed to free the lock: released, with an error.
		h.relErr = err
	case err != nil:
		// The session could not be reached within the release timeout
		// and still claims the lock: close it so the lock cannot leak.
		h.s.forceClose()
		h.relErr = err
		return err
	case res == 0:
		h.lose(fmt.Errorf("%w: %q was no longer held by its session", ErrLockLost, h.name))
		return h.state.Err()
	}
	h.unhold()
	if h.state.End() {
		backend.Report(h.ctx, h.opts, lock.Event{Backend: backendName, Op: lock.OpRelease, Name: h.name, Token: h.token, Held: time.Since(h.since), Err: h.relErr})
	}
	return h.relErr
}

// release runs fn on the holder's session for Release: at once if the
// session is free, else after waiting for it within
// backend.ReleaseContext. The context (and its timer) is made only when
// there is a wait.
func (h *Holder) release(fn func(sc *sessionConn) error) error {
	if !h.s.tryEnter() {
		ctx, cancel := backend.ReleaseContext(h.ctx)
		defer cancel()
		return h.s.do(ctx, false, fn)
	}
	return h.s.run(h.ctx, false, fn)
}

// unhold takes the holder out of its name's table, and wakes the name's
// local waiters.
func (h *Holder) unhold() {
	h.f.mu.Lock()
	if h.e.held[h.slot] == h {
		delete(h.e.held, h.slot)
		h.e.wakeLocked()
		h.f.unrefLocked(h.e)
	}
	h.f.mu.Unlock()
}

// lose records that the lock is gone: Done closes, Err matches
// ErrLockLost, and local waiters are woken.
func (h *Holder) lose(err error) {
	h.unhold()
	if h.state.Lose(err) {
		backend.Report(h.ctx, h.opts, lock.Event{Backend: backendName, Op: lock.OpLost, Name: h.name, Token: h.token, Held: time.Since(h.since), Err: err})
	}
}
