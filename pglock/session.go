package pglock

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/ubgo/lock"
	"github.com/ubgo/lock/backend"
)

// session is one dedicated connection that holds locks. Statements on it
// are serialised by sem; a session that fails is closed, every holder on
// it loses its lock, and the next statement opens a new connection.
type session struct {
	f   *Factory
	idx int
	sem chan struct{} // held while a statement runs

	// Guarded by sem.
	conn     *pgx.Conn
	mode     pgx.QueryExecMode // of the session's statements
	pid      uint32
	lastUsed time.Time
	marks    map[int64]int // semaphore markers held shared, by key: local permits
	waits    map[int64]int // waiters and intent keys held, by key: local waiters

	// What others read without waiting for sem: they are not to wait for a
	// statement (forceClose ends one). Taken after sem, never before.
	mu      sync.Mutex
	gen     uint64 // changes whenever the connection is replaced
	holders map[*Holder]struct{}
	netConn net.Conn // for forceClose
}

func newSession(f *Factory, idx int) *session {
	return &session{f: f, idx: idx, sem: make(chan struct{}, 1), marks: map[int64]int{}, waits: map[int64]int{}, holders: map[*Holder]struct{}{}}
}

// sessionConn is the session during one use.
type sessionConn struct {
	s   *session
	c   *pgx.Conn
	ctx context.Context // the use's: never cancelled by the caller, bounded by the statement timeout
}

// do runs fn with the session's connection, opening one if needed (and
// allowed). ctx bounds the wait for the session and for a pool connection;
// fn's statements run on a context without ctx's cancellation, bounded by
// the statement timeout, so a caller that gives up never leaves a
// statement's result unknown.
func (s *session) do(ctx context.Context, open bool, fn func(sc *sessionConn) error) error {
	select {
	case s.sem <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("pglock: waiting for lock session %d, busy with another statement: %w", s.idx, ctx.Err())
	}
	defer func() { <-s.sem }()
	if s.conn == nil {
		if !open {
			return fmt.Errorf("pglock: lock session %d is closed", s.idx)
		}
		s.f.mu.Lock()
		closed := s.f.closed
		s.f.mu.Unlock()
		if closed {
			return lock.ErrClosed
		}
		if err := s.open(ctx); err != nil {
			return err
		}
	}
	err := s.use(ctx, fn)
	s.lastUsed = time.Now()
	return err
}

// use runs fn on the open connection, bounded by the statement timeout: a
// use that runs out fails like a cut network (pgx closes the connection),
// which fails the session. sem is held.
func (s *session) use(ctx context.Context, fn func(sc *sessionConn) error) error {
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.f.set.stmtTimeout)
	defer cancel()
	return fn(&sessionConn{s: s, c: s.conn, ctx: sctx})
}

// open connects the session: a connection hijacked from the pool (so it
// never goes back to it), named for operators, with the pglock objects in
// place. sem is held.
func (s *session) open(ctx context.Context) error {
	if err := s.f.refusal(); err != nil {
		return err
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.f.set.stmtTimeout)
	defer cancel()
	var pid int32
	var syncCommit, version string
	var c *pgx.Conn
	// A pool connection whose server went away (a restart) fails its
	// first statement before sending it: take another. A pool holds at
	// most MaxConns such connections.
	for tries := s.f.pool.Config().MaxConns; ; tries-- {
		var err error
		if c, err = s.f.hijack(ctx, "acquire: opening a lock session"); err != nil {
			return err
		}
		// Simple protocol until the server is known to be one pglock
		// works with (see setup): no prepared statement behind a
		// transaction pooler.
		if err = checkVersion(c.PgConn().ParameterStatus("crdb_version")); err == nil {
			err = c.QueryRow(sctx, s.f.st.sessionOpen, pgx.QueryExecModeSimpleProtocol, s.f.set.appName).Scan(&pid, &syncCommit, nil, &version, nil)
		}
		if err == nil || !pgconn.SafeToRetry(err) || tries <= 0 || ctx.Err() != nil {
			return s.setUp(sctx, c, pid, syncCommit, version, err)
		}
		closeConn(c)
	}
}

// setUp finishes opening the session on c, whose first statement (pid,
// synchronous_commit, version) ended with err.
func (s *session) setUp(sctx context.Context, c *pgx.Conn, pid int32, syncCommit, version string, err error) error {
	if err == nil {
		err = s.f.setup(sctx, c, pid, version)
	}
	if err == nil && syncCommit == "off" {
		// A new token epoch must be flushed before its range is used: a
		// commit that is visible must be durable.
		_, err = c.Exec(sctx, "SET synchronous_commit = local")
	}
	if err == nil {
		_, err = c.Exec(sctx, s.f.st.sessionSweep, pgx.QueryExecModeSimpleProtocol)
	}
	if err != nil {
		closeConn(c)
		switch {
		case strings.HasPrefix(err.Error(), "pglock:"):
			return err
		case silent(sctx, err):
			return noAnswer("acquire: opening a lock session", s.f.set.stmtTimeout, err)
		}
		return fmt.Errorf("pglock: acquire: opening a lock session: %w", err)
	}
	s.conn, s.pid, s.lastUsed = c, uint32(pid), time.Now()
	// Prepared once per connection, each statement is then one round trip;
	// a pool configured without a statement cache keeps its own mode.
	s.mode = pgx.QueryExecModeCacheStatement
	if cc := c.Config(); cc.StatementCacheCapacity == 0 {
		s.mode = cc.DefaultQueryExecMode
	}
	s.f.open.Add(1)
	s.mu.Lock()
	s.netConn = c.PgConn().Conn()
	s.mu.Unlock()
	s.f.armHealth()
	return nil
}

// setup checks the server, and makes sure the schema objects exist, once
// per factory, on the first lock session c (backend pid, version()). A
// server pglock cannot work with is refused for good (see refusal).
func (f *Factory) setup(ctx context.Context, c *pgx.Conn, pid int32, version string) error {
	f.setupMu.Lock()
	defer f.setupMu.Unlock()
	if f.refused != nil || f.setupDone {
		return f.refused
	}
	err := checkVersion(version)
	if err == nil {
		err = f.checkPooler(ctx, c, pid)
	}
	if errors.Is(err, ErrNoAdvisoryLocks) || errors.Is(err, ErrSessionChanged) {
		f.refused = err
		return err
	}
	if err == nil {
		err = ensureObjects(ctx, c, f.st)
	}
	f.setupDone = err == nil
	return err
}

// hijack takes a connection out of the pool for good (see poolConn).
func (f *Factory) hijack(ctx context.Context, what string) (*pgx.Conn, error) {
	pc, err := f.poolConn(ctx, what)
	if err != nil {
		return nil, err
	}
	return pc.Hijack(), nil
}

// poolConn takes a connection from the pool for what, waiting at most the
// connect timeout (and never past ctx), so that neither an exhausted pool
// nor a silent server is a hang. Time running out is ErrPoolExhausted only
// if others held every pool connection all along; if one was idle when we
// asked (pgxpool pings one idle for a second), was being connected, or
// the pool had room, what did not come was the server's answer.
func (f *Factory) poolConn(ctx context.Context, what string) (*pgxpool.Conn, error) {
	idle := f.pool.Stat().IdleConns()
	start := time.Now()
	actx, cancel := context.WithTimeout(ctx, f.set.connectTimeout)
	defer cancel()
	pc, err := f.pool.Acquire(actx)
	if err == nil {
		return pc, nil
	}
	st := f.pool.Stat()
	inUse := fmt.Sprintf("%d of %d in use", st.AcquiredConns(), st.MaxConns())
	switch {
	case actx.Err() == nil:
		return nil, fmt.Errorf("pglock: %s: %w", what, err)
	case errors.Is(actx.Err(), context.DeadlineExceeded) && (idle > 0 || st.ConstructingConns() > 0 || st.AcquiredConns() < st.MaxConns()):
		d, _ := actx.Deadline()
		return nil, fmt.Errorf("pglock: %s: no answer from the server within %v (pool connections: %s, %d connecting): %w",
			what, d.Sub(start).Round(time.Millisecond), inUse, st.ConstructingConns(), err)
	case ctx.Err() != nil:
		return nil, fmt.Errorf("pglock: %s: waiting for a pool connection (%s): %w", what, inUse, ctx.Err())
	}
	return nil, fmt.Errorf("%w within %v (%s): %w", ErrPoolExhausted, f.set.connectTimeout, inUse, err)
}

// noAnswer is the error of a step the server did not answer within d: an
// outage, which never matches ErrLocked or ErrPoolExhausted.
func noAnswer(what string, d time.Duration, err error) error {
	return fmt.Errorf("pglock: %s: no answer from the server within %v: %w", what, d.Round(time.Millisecond), err)
}

// silent reports whether err is a statement's running out of the time ctx
// gave it: the server did not answer.
func silent(ctx context.Context, err error) bool {
	return ctx.Err() != nil && errors.Is(err, context.DeadlineExceeded)
}

// closeConn ends a connection at once. pgx closes a connection that failed
// in the background, keeping the socket open for up to 15s while it waits
// for the server; the socket is closed here so the server ends the session,
// and frees its locks, as soon as the close reaches it.
func closeConn(c *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	nc := c.PgConn().Conn()
	c.Close(ctx)
	nc.Close()
}

// queryRow runs one statement in the session's mode.
func (sc *sessionConn) queryRow(sql string, args ...any) pgx.Row {
	return sc.c.QueryRow(sc.ctx, sql, append([]any{sc.s.mode}, args...)...)
}

// checkPID fails the session if the statement ran on another backend than
// the one the session started on: its locks are not where we left them,
// and the factory refuses every later Acquire (see refuse).
func (sc *sessionConn) checkPID(pid int32) error {
	if uint32(pid) == sc.s.pid {
		return nil
	}
	err := fmt.Errorf("%w (backend %d, then %d)", ErrSessionChanged, sc.s.pid, pid)
	sc.s.f.refuse(err)
	return sc.fail(err)
}

// wrap says err, a statement's failure on the session, as "pglock: what:
// ...", naming the server's silence when the statement ran out of time.
func (sc *sessionConn) wrap(what string, err error) error {
	if silent(sc.ctx, err) {
		return noAnswer(what, sc.s.f.set.stmtTimeout, err)
	}
	return fmt.Errorf("pglock: %s: %w", what, err)
}

// failed is the error of a statement that failed on the session with err,
// said as what's: a clean server error leaves the session as it was, any
// other closes it.
func (sc *sessionConn) failed(what string, err error) error {
	err = sc.wrap(what, err)
	if sc.clean(err) {
		return err
	}
	return sc.fail(err)
}

// clean reports whether err is a server error that left the session
// usable: anything else (network, a use that ran out of time, a fatal
// error) leaves its state unknown.
func (sc *sessionConn) clean(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Severity != "FATAL" && pgErr.Severity != "PANIC" &&
		!sc.c.IsClosed() && sc.ctx.Err() == nil
}

// cleanup handles an acquire statement that failed: a server error may
// have come after the lock was taken, and session locks outlive the
// rolled-back statement, so the keys it tried are given up (none of them
// is held for anyone else on this session); if that fails too, or the error
// was not a clean server error, the session is closed.
func (sc *sessionConn) cleanup(err error, keys []int64, shared int64) error {
	if pooled(err) {
		// Nothing ran here, and what the session holds is on another
		// backend: closing the session is all that can be done.
		err = fmt.Errorf("%w: %w", ErrSessionChanged, err)
		sc.s.f.refuse(err)
		return sc.fail(err)
	}
	err = sc.wrap("acquire", err)
	if len(keys) == 0 && shared == 0 && sc.clean(err) {
		return err
	}
	return sc.abandon(err, keys, shared)
}

// newToken handles a counter value v outside the range of the epoch the
// factory knows, for key, which this session has just taken: it reads the
// committed epoch (v is a token if it lies in its range), else moves the
// counter to a new epoch (after a crash reset it, or its range ran out)
// and takes a new value, which replaces v in the holder's row if the
// acquire wrote one. Rare: a few round trips.
func (sc *sessionConn) newToken(v, key int64, row bool) (int64, error) {
	f := sc.s.f
	tok, err := f.freshToken(v, sc.queryRow, sc.checkPID)
	if err == nil && row && tok != v {
		if _, err := sc.c.Exec(sc.ctx, f.st.retoken, key, v, tok); err != nil {
			return 0, fmt.Errorf("pglock: new token epoch: %w", err)
		}
	}
	return tok, err
}

// freshToken is newToken's reading and moving of the epoch, with query
// running each statement (on a lock session, or on the pool for
// AcquireInTx: a new epoch must commit on its own) and check checking the
// backend pid it answers with.
func (f *Factory) freshToken(v int64, query func(sql string, args ...any) pgx.Row, check func(pid int32) error) (int64, error) {
	var (
		e   int64
		pid int32
	)
	if err := query(f.st.epoch).Scan(&e, &pid); err != nil {
		return 0, fmt.Errorf("pglock: token epoch: %w", err)
	}
	if err := check(pid); err != nil {
		return 0, err
	}
	f.seeEpoch(e)
	if f.validToken(v) {
		return v, nil
	}
	for i := 0; i < 5; i++ {
		if err := query(f.st.rebase).Scan(&pid); err != nil {
			return 0, fmt.Errorf("pglock: new token epoch: %w", err)
		}
		var tok int64
		if err := query(f.st.token).Scan(&tok, &e, &pid); err != nil {
			return 0, fmt.Errorf("pglock: new token epoch: %w", err)
		}
		if err := check(pid); err != nil {
			return 0, err
		}
		f.seeEpoch(e)
		if tok > 0 && f.validToken(tok) {
			return tok, nil
		}
	}
	return 0, errNoToken
}

// errNoToken: the counter stayed out of range; the session is fine.
var errNoToken = errors.New("pglock: no token after moving to a new epoch five times")

// abandon gives up keys held exclusive and one held shared (a semaphore's
// marker, or a reader's mutex key; 0: none) that this statement's caller
// took for a holder that is not to be, after cause, with the rows written
// for them; if the session cannot do it, it is closed.
func (sc *sessionConn) abandon(cause error, keys []int64, shared int64) error {
	if sc.s.conn == nil {
		return cause // already failed: the locks went with it
	}
	if !sc.clean(cause) && !errors.Is(cause, errNoToken) {
		return sc.fail(cause)
	}
	if _, err := sc.c.Exec(sc.ctx, sc.s.f.st.abandon, keys, shared, shared != 0); err != nil {
		return sc.fail(errors.Join(cause, err))
	}
	return cause
}

// fail closes the session: Postgres frees every lock it held, and every
// holder on it loses its lock. sem is held.
func (sc *sessionConn) fail(cause error) error {
	sc.s.failLocked(cause)
	return cause
}

func (s *session) failLocked(cause error) {
	if s.conn != nil {
		closeConn(s.conn)
		s.conn = nil
		s.f.open.Add(-1)
	}
	s.marks, s.waits = map[int64]int{}, map[int64]int{}
	s.mu.Lock()
	s.gen++
	hs := s.holders
	s.holders, s.netConn = map[*Holder]struct{}{}, nil
	s.mu.Unlock()
	lost := fmt.Errorf("%w: %w", backend.Loss(ErrLockLost, lock.ErrSessionEnded, "lock session ended"), cause)
	for h := range hs {
		h.lose(lost)
	}
	// Waiters mark the names they wait for again, on the next connection.
	s.f.lis.broadcast()
	if len(hs) > 0 {
		level := slog.LevelWarn
		if errors.Is(cause, lock.ErrClosed) {
			level = slog.LevelDebug // Close ended it, as asked
		}
		backend.Log(&s.f.cfg.Options).Log(context.Background(), level, "pglock: lock session lost", "session", s.idx, "holders", len(hs), "err", cause)
	}
}

// add records a new holder on the session. sem is held.
func (s *session) add(h *Holder) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.holders[h] = struct{}{}
}

// remove forgets a released holder. sem is held.
func (s *session) remove(h *Holder) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.holders, h)
}

func (s *session) generation() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.gen
}

func (s *session) holds(h *Holder) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.holders[h]
	return ok
}

// forceClose closes the connection under a statement that does not
// return, so that the statement fails and the session is failed.
func (s *session) forceClose() {
	s.mu.Lock()
	nc := s.netConn
	s.mu.Unlock()
	if nc != nil {
		nc.Close()
	}
}

// armHealth starts the periodic health check once a session is open.
func (f *Factory) armHealth() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.closed && f.health == nil {
		f.health = time.AfterFunc(f.set.health, f.healthTick)
	}
}

// healthTick checks every idle open session with a query; a session that
// does not answer, or answers from another backend, is failed. The checks
// run at the same time: on a cut network each waits out the statement
// timeout, and one after another the k-th session would be found lost only
// after k of them. It stops when no session is open, and open starts it
// again.
func (f *Factory) healthTick() {
	var wg sync.WaitGroup
	for _, s := range f.all() {
		wg.Go(s.check)
	}
	wg.Wait()
	f.mu.Lock()
	defer f.mu.Unlock()
	// A session opening now counts itself before it calls armHealth, so
	// either this sees it or armHealth finds no timer and starts one.
	if !f.closed && f.open.Load() > 0 {
		f.health.Reset(f.set.health)
	} else {
		f.health = nil
	}
}

// check runs the health check of the session, or closes it if it has held
// nothing and served no waiter for a minute (cfg.idleClose): a factory that
// is never closed does not keep its connections for ever.
func (s *session) check() {
	select {
	case s.sem <- struct{}{}:
	default:
		return // a statement is running: it fails by itself if the session is gone
	}
	defer func() { <-s.sem }()
	if s.conn == nil {
		return
	}
	s.mu.Lock()
	unused := len(s.holders) == 0
	s.mu.Unlock()
	if unused && len(s.waits) == 0 && len(s.marks) == 0 && time.Since(s.lastUsed) > s.f.set.idleClose {
		s.failLocked(errors.New("pglock: lock session idle"))
		return
	}
	s.use(context.Background(), func(sc *sessionConn) error {
		var pid int32
		if err := sc.queryRow(s.f.st.health).Scan(&pid); err != nil {
			return sc.fail(sc.wrap("health check", err))
		}
		return sc.checkPID(pid)
	})
}

// close fails the session for Close: its connection is closed, which frees
// its locks, and its holders lose them.
func (s *session) close() {
	select {
	case s.sem <- struct{}{}:
	case <-time.After(s.f.set.stmtTimeout):
		s.forceClose()
		s.sem <- struct{}{}
	}
	defer func() { <-s.sem }()
	s.failLocked(lock.ErrClosed)
}
