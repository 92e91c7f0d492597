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
	waits    []*session // wait sessions: one per name whose head waiter blocks (see block)
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
	noWait  time.Time      // when a wait session last could not be opened
	hot     map[int64]bool // mutex keys whose last release here went straight to a blocked waiter

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
// being acquired): who of this factory holds which permit.
type entry struct {
	prefix, name string
	keys         keys
	limit        int                  // the limit of the current local holders
	held         map[int]*Holder      // by slot
	readers      map[*Holder]struct{} // shared holders (WithShared), beside no held
	busy         chan struct{}        // one local acquire statement at a time
	refs         int                  // holders and Acquire calls using it; guarded by Factory.mu
	queue        []*waitReg           // this factory's waiters, first come first; guarded by Factory.mu
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
		entries: map[int64]*entry{}, hot: map[int64]bool{},
	}
	f.life, f.end = context.WithCancel(context.Background())
	for i := 0; i < set.sessions; i++ {
		f.sessions = append(f.sessions, newSession(f, i))
	}
	for i := 0; i < set.waitSessions; i++ {
		f.waits = append(f.waits, newSession(f, set.sessions+i))
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
func (f *Factory) all() []*session { return slices.Concat(f.sessions, f.waits) }

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

// contended notes that a release of the mutex key went straight to a
// waiter: the next waiting Acquire here blocks at once. The notes are few
// (one per name released so, until it is acquired again) and are dropped
// all at once if they pile up.
func (f *Factory) contended(key int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.hot) >= 1024 {
		clear(f.hot)
	}
	f.hot[key] = true
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

func (f *Factory) session(k keys) *session {
	return f.sessions[uint64(k.mutex)%uint64(len(f.sessions))]
}

// take makes attempts at name through backend.Wait. A waiter queues
// behind this factory's earlier waiters of the name; the first of them
// blocks in Postgres on a wait session of its own (see block), or, for a
// semaphore or when no wait session is free, retries when a release is
// notified (see waitReg).
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
	f.mu.Lock()
	// Behind waiters of this process, or at a name that a blocked waiter
	// took at its last release here, the first attempt is to wait: a try
	// would find it held.
	queued := o.Wait && (len(e.queue) > 0 || f.hot[e.keys.mutex] && o.Limit() == 1)
	delete(f.hot, e.keys.mutex)
	f.mu.Unlock()
	var w *waitReg
	waiting := backend.Waiting{
		Wait: o.Wait, Locked: ErrLocked, Closed: f.life.Done(), Queued: queued,
		MinPoll: f.set.poll, MaxPoll: f.set.poll,
		Subscribe: func() (backend.Subscription, error) {
			w = f.subscribe(ctx, s, e, queued, o.Limit() == 1 && !o.Shared)
			return w, nil
		},
	}
	return backend.Wait(ctx, waiting, func() (*Holder, time.Duration, error) {
		if w != nil {
			writer := o.Limit() == 1 && !o.Shared
			first, ws := f.turn(w, writer)
			if !first {
				return nil, 0, ErrLocked // behind this factory's earlier waiters
			}
			if ws != nil {
				h, err := f.block(ctx, ws, e, o)
				if !errors.Is(err, errNoWaitSession) {
					return h, 0, err
				}
			}
			if err := w.listen(); err != nil {
				return nil, 0, err
			}
			if writer {
				// Not in Postgres's queue of the key: keep readers out
				// by the intent key instead (see holdIntent).
				if err := f.holdIntent(w); err != nil {
					return nil, 0, err
				}
			}
		}
		// If the session ends under the attempt (terminated, or its
		// connection cut), Postgres freed all it held: a waiter tries
		// again on the next session, once. A second loss in a row (a
		// session that cannot work: a pooler, a dying server) is returned.
		for retried := false; ; retried = true {
			gen := s.generation()
			h, err := f.try(ctx, s, e, o)
			if err == nil || errors.Is(err, ErrLocked) || !o.Wait || retried || s.generation() == gen {
				return h, 0, err
			}
		}
	})
}

// try makes one attempt at a permit of e: one statement on the session.
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
	// Postgres lets a session's own locks through, so this factory keeps
	// its readers and writers of a name apart itself; a reader that does
	// not wait also gives way to a writer waiting here.
	if o.Shared && (len(e.held) > 0 || !o.Wait && f.writerWaitsLocked(e)) || !o.Shared && len(e.readers) > 0 {
		f.mu.Unlock()
		if limit > 1 {
			return nil, mismatch(e.name, 1, limit)
		}
		return nil, ErrLocked
	}
	localHolders := len(e.held)
	joining := len(e.readers) > 0
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
	// Only a call that set something for Inspect to show writes a row.
	pub := o.Owner != "" || len(o.Metadata) > 0
	var h *Holder
	err := s.do(ctx, true, func(sc *sessionConn) error {
		var (
			key  int64
			slot int
			tok  int64
			err  error
		)
		if o.Shared {
			key = e.keys.mutex
			q, args := f.sharedStatement(e, o, pub, joining)
			var pid int32
			err = sc.queryRow(q, args...).Scan(&tok, &pid)
			tok, err = f.mutexResult(sc, e, pub, tok, pid, err, true)
		} else if limit == 1 {
			key = e.keys.mutex
			q, args := f.mutexStatement(e, o, pub, false)
			var pid int32
			err = sc.queryRow(q, args...).Scan(&tok, &pid)
			tok, err = f.mutexResult(sc, e, pub, tok, pid, err, false)
		} else {
			key, slot, tok, err = f.trySemaphore(sc, e, o, pub, slots, localHolders)
		}
		if err != nil {
			return err
		}
		h = f.hold(ctx, s, e, key, slot, limit, tok, pub, o)
		return nil
	})
	return h, err
}

// hold records the holder of e's permit slot, just taken on s. The sem of
// s is held.
func (f *Factory) hold(ctx context.Context, s *session, e *entry, key int64, slot, limit int, tok int64, pub bool, o *lock.Options) *Holder {
	h := &Holder{
		f: f, s: s, gen: s.gen, e: e, key: key, slot: slot, limit: limit, token: uint64(tok),
		pid: s.pid, since: time.Now(), published: pub, shared: o.Shared, opts: o,
		ctx: context.WithoutCancel(ctx), state: backend.NewState(),
	}
	f.mu.Lock()
	// A holder of this factory on another session may not have taken
	// itself out yet: Postgres gave the lock here, so its release is done.
	if h.shared {
		e.readers[h] = struct{}{}
	} else {
		e.held[slot] = h
	}
	e.limit = limit
	e.refs++ // the holder's reference
	f.mu.Unlock()
	s.add(h)
	h.state.Bound(o, ErrLockLost, nil, h.endHold)
	return h
}

func mismatch(name string, have, want int) error {
	return fmt.Errorf("pglock: %w: %q has limit %d, caller asked for %d", lock.ErrLimitMismatch, name, have, want)
}

// row is what a published holder's row stores besides its lock: the owner,
// and the metadata as a JSON object (nil: none).
func row(o *lock.Options) (owner string, meta *string) {
	if len(o.Metadata) > 0 {
		m := jsonObject(o.Metadata)
		meta = &m
	}
	return o.Owner, meta
}

// mutexStatement is the statement that takes the mutex of e, with its
// arguments: at once or not at all, or (wait) blocking until Postgres
// grants it. It returns the counter value and the backend pid.
func (f *Factory) mutexStatement(e *entry, o *lock.Options, pub, wait bool) (string, []any) {
	q := [2][2]string{{f.st.mutexAcquire, f.st.mutexAcquirePub}, {f.st.mutexWait, f.st.mutexWaitPub}}[b2i(wait)][b2i(pub)]
	if pub {
		owner, meta := row(o)
		return q, []any{e.keys.mutex, e.keys.mark, e.prefix, e.name, owner, meta}
	}
	return q, []any{e.keys.mutex, e.keys.mark}
}

// sharedStatement is the statement that takes e shared (WithShared), at
// once or not at all, with its arguments; joining: this factory's readers
// hold it already, on the same session.
func (f *Factory) sharedStatement(e *entry, o *lock.Options, pub, joining bool) (string, []any) {
	q := [2][2]string{{f.st.sharedAcquire, f.st.sharedAcquirePub}, {f.st.sharedJoin, f.st.sharedJoinPub}}[b2i(joining)][b2i(pub)]
	if pub {
		owner, meta := row(o)
		return q, []any{e.keys.mutex, e.keys.mark, e.prefix, e.name, owner, meta, e.keys.intent}
	}
	return q, []any{e.keys.mutex, e.keys.mark, e.keys.intent}
}

// writerWaitsLocked reports whether a writer of this factory waits for e.
// f.mu is held.
func (f *Factory) writerWaitsLocked(e *entry) bool {
	for _, w := range e.queue {
		if w.writer {
			return true
		}
	}
	return false
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// mutexResult turns the outcome of a mutex statement, or with shared of
// a shared one, into the token.
func (f *Factory) mutexResult(sc *sessionConn, e *entry, pub bool, tok int64, pid int32, err error, shared bool) (int64, error) {
	key := e.keys.mutex
	keys, sharedKey := []int64{key}, int64(0)
	if shared {
		keys, sharedKey = nil, key // the unlock statement unlocks its "mark" shared
	}
	if err != nil {
		return 0, sc.cleanup(err, keys, sharedKey)
	}
	if err := sc.checkPID(pid); err != nil {
		return 0, err
	}
	if tok > 0 && !f.validToken(tok) {
		if tok, err = sc.newToken(tok, key, pub); err != nil {
			return 0, sc.unlock(err, keys, sharedKey)
		}
	}
	switch {
	case tok > 0:
		return tok, nil
	case tok == -1:
		return 0, ErrLocked
	case tok == -2 && shared:
		return 0, fmt.Errorf("pglock: %w: %q is held as a semaphore, caller asked for it shared", lock.ErrLimitMismatch, e.name)
	case tok == -2:
		return 0, fmt.Errorf("pglock: %w: %q is held as a semaphore, caller asked for a mutex", lock.ErrLimitMismatch, e.name)
	}
	// The unlock after a failed check did not find the lock: the session
	// is not what we think it is.
	return 0, sc.fail(fmt.Errorf("pglock: unexpected acquire result %d", tok))
}

// trySemaphore takes one of the free slots of e, returning its key, slot
// and token. A name's first use as a semaphore, or a change of its limit,
// takes a statement more.
func (f *Factory) trySemaphore(sc *sessionConn, e *entry, o *lock.Options, pub bool, slots []int, localHolders int) (key int64, slot int, tok int64, err error) {
	limit := o.Limit()
	keys := make([]int64, len(slots))
	slots32 := make([]int32, len(slots))
	for i, s := range slots {
		keys[i] = advisoryKey(kindSlot, e.prefix, e.name, s)
		slots32[i] = int32(s)
	}
	owner, meta := row(o)
	for attempt := 0; ; attempt++ {
		takeMark := sc.s.marks[e.keys.mark] == 0
		var mark int64 // the marker to give back on failure
		if takeMark {
			mark = e.keys.mark
		}
		var (
			got, stored *int32
			pid, status int32
			t           *int64
		)
		err := sc.queryRow(f.st.semAcquire, keys, slots32, e.keys.mark, takeMark, e.keys.mutex, e.keys.limit, int32(limit), e.prefix, e.name,
			pub, owner, meta).Scan(&got, &t, &stored, &pid, &status)
		if err != nil {
			return 0, 0, 0, sc.cleanup(err, keys, mark)
		}
		if err := sc.checkPID(pid); err != nil {
			return 0, 0, 0, err
		}
		switch status {
		case 0:
			slot = int(*got)
			key = advisoryKey(kindSlot, e.prefix, e.name, slot)
			tok = *t
			if !f.validToken(tok) {
				if tok, err = sc.newToken(tok, key, pub); err != nil {
					return 0, 0, 0, sc.unlock(err, []int64{key}, mark)
				}
			}
			sc.s.marks[e.keys.mark]++
			return key, slot, tok, nil
		case 1:
			return 0, 0, 0, ErrLocked
		case 3:
			return 0, 0, 0, fmt.Errorf("%w: %q and the stored name of its limits row", ErrKeyCollision, e.name)
		case 4:
			return 0, 0, 0, fmt.Errorf("pglock: %w: %q is held as a mutex, caller asked for limit %d", lock.ErrLimitMismatch, e.name, limit)
		case 5:
			return 0, 0, 0, fmt.Errorf("pglock: %w: %q is held shared, caller asked for limit %d", lock.ErrLimitMismatch, e.name, limit)
		}
		// status 2: the stored limit differs. It may change only while
		// nobody holds the name, and never under this factory's own holders.
		have := int(*stored)
		if localHolders > 0 || attempt >= 3 {
			return 0, 0, 0, mismatch(e.name, have, limit)
		}
		all := make([]int64, max(have, limit))
		for i := range all {
			all[i] = advisoryKey(kindSlot, e.prefix, e.name, i)
		}
		var done, pid2 int32
		if err := sc.queryRow(f.st.relimit, all, e.keys.limit, int32(limit), e.prefix, e.name).Scan(&done, &pid2); err != nil {
			return 0, 0, 0, sc.cleanup(err, nil, 0)
		}
		if err := sc.checkPID(pid2); err != nil {
			return 0, 0, 0, err
		}
		switch done {
		case 0:
			// Permits are held: by holders of another limit (a mismatch
			// the next attempt reports again), or by holders of our own
			// limit that another session set meanwhile (the next attempt
			// sees it).
		case 3:
			return 0, 0, 0, fmt.Errorf("%w: %q and the stored name of its limits row", ErrKeyCollision, e.name)
		}
	}
}
