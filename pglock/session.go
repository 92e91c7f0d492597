package pglock

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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
	pid      uint32
	lastUsed time.Time
	deadline time.Time                            // the socket's deadline; zero: none set
	marks    map[int64]int                        // semaphore markers held shared, by key: local permits
	waits    map[int64]int                        // waiters keys held shared, by key: local waiters
	hot      [numHot]*pgconn.StatementDescription // prepared on conn, on first use
	args     [3][8]byte                           // the binary parameters of a hot statement
	params   [3][]byte

	sc sessionConn // the one in use; guarded by sem

	due atomic.Bool // a publication is due; the goroutine holding sem does it

	mu      sync.Mutex // guards the fields below; taken after sem, never before
	gen     uint64     // changes whenever the connection is replaced
	holders map[*Holder]struct{}
	pending []*Holder   // held, not yet written to pglock_holders
	armed   bool        // a publication is scheduled
	pub     *time.Timer // runs publishTimer; made on first use
	netConn net.Conn    // for forceClose
}

func newSession(f *Factory, idx int) *session {
	return &session{f: f, idx: idx, sem: make(chan struct{}, 1), marks: map[int64]int{}, waits: map[int64]int{}, holders: map[*Holder]struct{}{}}
}

// sessionConn is the session while a statement runs on it.
type sessionConn struct {
	s      *session
	c      *pgx.Conn
	ctx    context.Context // the statements': never cancelled, bounded by the socket deadline
	caller context.Context // the caller's, for its values
}

// do runs fn with the session's connection, opening one if needed (and
// allowed). ctx bounds the wait for the session and for a pool connection;
// fn's statements ignore ctx and are bounded by the statement timeout, so a
// caller that gives up never leaves a statement's result unknown. Before
// letting the session go, do publishes holders if that is due.
func (s *session) do(ctx context.Context, open bool, fn func(sc *sessionConn) error) error {
	select {
	case s.sem <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	return s.run(ctx, open, fn)
}

// tryEnter takes the session if it is free. On success the caller must
// call run, which lets it go.
func (s *session) tryEnter() bool {
	select {
	case s.sem <- struct{}{}:
		return true
	default:
		return false
	}
}

// run is do once sem is held; it lets sem go.
func (s *session) run(ctx context.Context, open bool, fn func(sc *sessionConn) error) error {
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
	s.arm()
	s.sc = sessionConn{s: s, c: s.conn, ctx: context.Background(), caller: ctx}
	err := fn(&s.sc)
	s.sc.caller = nil
	if s.conn != nil && s.due.Load() {
		s.publishLocked()
	}
	s.lastUsed = time.Now()
	return err
}

// arm bounds the coming use of the session by the statement timeout. The
// bound is a deadline on the socket rather than a context: cheaper on the
// hot path, and a statement that runs out fails like a cut network, which
// fails the session. The deadline stays set between uses (an expired one
// matters only to the next use, which moves it first) and is moved only
// once it is more than a hundredth of the timeout closer than the full
// timeout, so back-to-back statements do not each pay for a runtime timer
// update, and the thread wake-up a new timer may cost. sem is held.
func (s *session) arm() {
	now := time.Now()
	t := s.f.cfg.stmtTimeout
	if s.deadline.Sub(now) < t-t/100 {
		s.deadline = now.Add(t)
		s.conn.PgConn().Conn().SetDeadline(s.deadline)
	}
}

// open connects the session: a connection hijacked from the pool (so it
// never goes back to it), named for operators, with the pglock objects in
// place. sem is held.
func (s *session) open(ctx context.Context) error {
	c, err := s.f.hijack(ctx)
	if err != nil {
		return err
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.f.cfg.stmtTimeout)
	defer cancel()
	var pid int32
	var syncCommit string
	err = c.QueryRow(sctx, "SELECT pg_backend_pid(), current_setting('synchronous_commit'), set_config('application_name', $1, false)",
		pgx.QueryExecModeSimpleProtocol, s.f.cfg.appName).Scan(&pid, &syncCommit, nil)
	if err == nil && syncCommit == "off" {
		// A new token epoch must be flushed before its range is used: a
		// commit that is visible must be durable.
		_, err = c.Exec(sctx, "SET synchronous_commit = local")
	}
	if err == nil {
		err = s.f.setup(sctx, c)
	}
	if err == nil {
		// Rows of sessions that ended (Inspect ignores them anyway).
		_, err = c.Exec(sctx, "DELETE FROM "+pgx.Identifier{s.f.cfg.schema, "pglock_holders"}.Sanitize()+
			" h WHERE NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = h.pid)", pgx.QueryExecModeSimpleProtocol)
	}
	if err != nil {
		closeConn(c)
		if strings.HasPrefix(err.Error(), "pglock:") {
			return err
		}
		return fmt.Errorf("pglock: opening a lock session: %w", err)
	}
	s.conn, s.pid, s.lastUsed, s.deadline, s.hot = c, uint32(pid), time.Now(), time.Time{}, [numHot]*pgconn.StatementDescription{}
	s.f.open.Add(1)
	s.mu.Lock()
	s.netConn = c.PgConn().Conn()
	s.mu.Unlock()
	s.f.armHealth()
	return nil
}

// setup makes sure the schema objects exist, once per factory.
func (f *Factory) setup(ctx context.Context, c *pgx.Conn) error {
	f.setupMu.Lock()
	defer f.setupMu.Unlock()
	if f.setupDone {
		return nil
	}
	if err := ensureObjects(ctx, c, f.st); err != nil {
		return err
	}
	f.setupDone = true
	return nil
}

// hijack takes a connection out of the pool for good, waiting at most the
// connect timeout (and never past ctx) so that an exhausted pool is an
// error, not a hang.
func (f *Factory) hijack(ctx context.Context) (*pgx.Conn, error) {
	actx, cancel := context.WithTimeout(ctx, f.cfg.connectTimeout)
	defer cancel()
	pc, err := f.pool.Acquire(actx)
	if err != nil {
		st := f.pool.Stat()
		switch {
		case ctx.Err() != nil:
			return nil, fmt.Errorf("pglock: waiting for a pool connection (%d of %d in use): %w", st.AcquiredConns(), st.MaxConns(), ctx.Err())
		case actx.Err() != nil:
			return nil, fmt.Errorf("%w within %v (%d of %d in use): %w", ErrPoolExhausted, f.cfg.connectTimeout, st.AcquiredConns(), st.MaxConns(), err)
		}
		return nil, fmt.Errorf("pglock: opening a lock session: %w", err)
	}
	return pc.Hijack(), nil
}

// closeConn ends a connection at once. pgx closes a connection that failed
// in the background, keeping the socket open for up to 15s while it waits
// for the server; the socket is closed here so the server ends the session,
// and frees its locks, as soon as the close reaches it.
func closeConn(c *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	nc := c.PgConn().Conn()
	nc.SetDeadline(time.Time{}) // a session keeps its last one; ctx bounds the close
	c.Close(ctx)
	nc.Close()
}

// queryRow runs one statement as a cached prepared statement: one round
// trip once the session has prepared it.
func (sc *sessionConn) queryRow(sql string, args []any, dest ...any) error {
	return sc.c.QueryRow(sc.ctx, sql, append([]any{pgx.QueryExecModeCacheStatement}, args...)...).Scan(dest...)
}

// The hot statements: the mutex acquire and releases.
const (
	hotAcquire = iota
	hotRelease
	hotReleasePub
	numHot
)

var (
	hotNames    = [numHot]string{"pglock_mutex_acquire", "pglock_mutex_release", "pglock_mutex_release_pub"}
	binaryCodes = []int16{1} // every parameter and result in binary
)

// hot runs a hot statement, prepared on the session's connection on its
// first use, with int8 parameters and two integer results (a value and
// pg_backend_pid()), all in binary. It goes to pgconn directly: one round
// trip, as queryRow, without pgx's per-query work (statement cache lookup,
// argument encoding through the type map, scan plans) and allocations.
func (sc *sessionConn) hot(which int, args ...int64) (v int64, pid int32, err error) {
	s, pg := sc.s, sc.c.PgConn()
	sd := s.hot[which]
	if sd == nil {
		sql := [numHot]string{s.f.st.mutexAcquire, s.f.st.mutexRelease, s.f.st.mutexReleasePub}[which]
		if sd, err = pg.Prepare(sc.ctx, hotNames[which], sql, nil); err != nil {
			return 0, 0, err
		}
		s.hot[which] = sd
	}
	for i, a := range args {
		binary.BigEndian.PutUint64(s.args[i][:], uint64(a))
		s.params[i] = s.args[i][:]
	}
	rr := pg.ExecStatement(sc.ctx, sd, s.params[:len(args)], binaryCodes, binaryCodes)
	rows, ok := 0, false
	for rr.NextRow() {
		rows++
		if vals := rr.Values(); len(vals) == 2 {
			var p int64
			v, ok = binaryInt(vals[0])
			p, ok2 := binaryInt(vals[1])
			pid, ok = int32(p), ok && ok2
		}
	}
	if _, err := rr.Close(); err != nil {
		return 0, 0, err
	}
	if rows != 1 || !ok {
		// Not a server error: the session is closed, as for any result
		// that cannot be trusted.
		return 0, 0, fmt.Errorf("pglock: unexpected result of %s (%d rows)", hotNames[which], rows)
	}
	return v, pid, nil
}

// binaryInt decodes a binary int4 or int8.
func binaryInt(b []byte) (int64, bool) {
	switch len(b) {
	case 4:
		return int64(int32(binary.BigEndian.Uint32(b))), true
	case 8:
		return int64(binary.BigEndian.Uint64(b)), true
	}
	return 0, false
}

// checkPID fails the session if the statement ran on another backend than
// the one the session started on: its locks are not where we left them.
func (sc *sessionConn) checkPID(pid int32) error {
	if uint32(pid) == sc.s.pid {
		return nil
	}
	return sc.fail(fmt.Errorf("%w (backend %d, then %d)", ErrSessionChanged, sc.s.pid, pid))
}

// clean reports whether err is a server error that left the session
// usable: anything else (network, timeout, a fatal error) leaves its state
// unknown.
func (sc *sessionConn) clean(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Severity != "FATAL" && pgErr.Severity != "PANIC" && !sc.c.IsClosed()
}

// cleanup handles an acquire statement that failed: a server error may
// have come after the lock was taken, and session locks outlive the
// rolled-back statement, so the keys it tried are unlocked (none of them is
// held for anyone else on this session); if that fails too, or the error
// was not a clean server error, the session is closed.
func (sc *sessionConn) cleanup(err error, keys []int64, mark int64) error {
	err = fmt.Errorf("pglock: acquire: %w", err)
	if len(keys) == 0 && mark == 0 && sc.clean(err) {
		return err
	}
	if keys == nil {
		keys = []int64{}
	}
	return sc.unlock(err, keys, mark)
}

// newToken handles a counter value v outside the range of the epoch the
// factory knows, for a lock this session has just taken: it reads the
// committed epoch (v is a token if it lies in its range), else moves the
// counter to a new epoch (after a crash reset it, or its range ran out)
// and takes a new value. Rare: a few round trips.
func (sc *sessionConn) newToken(v int64) (int64, error) {
	f := sc.s.f
	var (
		e   int64
		pid int32
	)
	if err := sc.queryRow(f.st.epoch, nil, &e, &pid); err != nil {
		return 0, fmt.Errorf("pglock: token epoch: %w", err)
	}
	if err := sc.checkPID(pid); err != nil {
		return 0, err
	}
	f.seeEpoch(e)
	if f.validToken(v) {
		return v, nil
	}
	for i := 0; i < 5; i++ {
		if err := sc.queryRow(f.st.rebase, nil, &pid); err != nil {
			return 0, fmt.Errorf("pglock: new token epoch: %w", err)
		}
		var tok int64
		if err := sc.queryRow(f.st.token, nil, &tok, &e, &pid); err != nil {
			return 0, fmt.Errorf("pglock: new token epoch: %w", err)
		}
		if err := sc.checkPID(pid); err != nil {
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

// unlock gives up keys (and a shared semaphore marker) this statement's
// caller took, after a failure that left no holder for them; if the
// session cannot do it, it is closed.
func (sc *sessionConn) unlock(cause error, keys []int64, mark int64) error {
	if sc.s.conn == nil {
		return cause // already failed: the locks went with it
	}
	if !sc.clean(cause) && !errors.Is(cause, errNoToken) {
		return sc.fail(cause)
	}
	_, err := sc.c.Exec(sc.ctx, `SELECT pg_advisory_unlock(k) FROM unnest($1::int8[]) k
		UNION ALL SELECT pg_advisory_unlock_shared($2::int8) WHERE $3::bool`, keys, mark, mark != 0)
	if err != nil {
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
	s.holders, s.pending, s.netConn = map[*Holder]struct{}{}, nil, nil
	s.mu.Unlock()
	lost := fmt.Errorf("%w: lock session ended: %w", ErrLockLost, cause)
	for h := range hs {
		h.lose(lost)
	}
	// Waiters re-mark the names they wait for on the next connection.
	s.f.lis.broadcast()
	if len(hs) > 0 {
		backend.Log(&s.f.opts).Warn("pglock: lock session lost", "session", s.idx, "holders", len(hs), "err", cause)
	}
}

// add records a new holder on the session and schedules its publication.
// sem is held.
func (s *session) add(h *Holder) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.holders[h] = struct{}{}
	s.pending = append(s.pending, h)
	s.armLocked(publishDelay)
}

// armLocked schedules a publication in d, unless one is scheduled. s.mu
// is held.
func (s *session) armLocked(d time.Duration) {
	if !s.armed {
		s.armed = true
		d = max(d, publishDelay/8)
		if s.pub == nil {
			s.pub = time.AfterFunc(d, s.publishTimer)
		} else {
			s.pub.Reset(d)
		}
	}
}

// dueLocked drops from pending the holders released or lost since they
// were added, and reports whether one of the others has been held for
// publishDelay (then 0) or else how long until the oldest will have been
// (-1 when none is left). s.mu is held.
func (s *session) dueLocked(now time.Time) time.Duration {
	keep := s.pending[:0]
	for _, h := range s.pending {
		if _, ok := s.holders[h]; ok {
			keep = append(keep, h)
		}
	}
	clear(s.pending[len(keep):])
	s.pending = keep
	if len(keep) == 0 {
		return -1
	}
	return max(publishDelay-now.Sub(keep[0].since), 0) // pending is in acquisition order
}

// remove forgets a released holder. sem is held.
func (s *session) remove(h *Holder) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.holders, h)
	if len(s.holders) == 0 && s.armed {
		// Nothing left to publish: a lock taken and given back again and
		// again keeps no timer running.
		s.pub.Stop()
		s.armed = false
		clear(s.pending)
		s.pending = s.pending[:0]
	}
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

// publishTimer publishes what is due, on the session if it is free. If a
// statement is running, it only flags the work, which that statement's
// goroutine does before letting the session go: waiting for the session
// here would put a goroutine switch into the hot path.
func (s *session) publishTimer() {
	s.mu.Lock()
	s.armed = false
	d := s.dueLocked(time.Now())
	if d != 0 {
		// Nothing held long enough (the usual case of locks released
		// within publishDelay): look again when something may be, without
		// taking the session, so no statement ever waits for this.
		if d > 0 {
			s.armLocked(d)
		}
		s.mu.Unlock()
		return
	}
	s.mu.Unlock()
	select {
	case s.sem <- struct{}{}:
		defer func() { <-s.sem }()
		if s.conn == nil {
			return
		}
		s.arm()
		s.publishLocked()
	default:
		s.due.Store(true)
		// In case that statement ended before it saw the flag.
		s.mu.Lock()
		s.armLocked(publishDelay)
		s.mu.Unlock()
	}
}

// publishLocked writes the holders held for at least publishDelay to
// pglock_holders, in one statement, so that Inspect from any process can
// report their tokens. sem is held and the deadline set.
func (s *session) publishLocked() {
	s.due.Store(false)
	now := time.Now()
	s.mu.Lock()
	var batch, keep []*Holder
	for _, h := range s.pending {
		if _, ok := s.holders[h]; !ok || h.published || h.state.Ended() {
			continue
		}
		if now.Sub(h.since) < publishDelay {
			keep = append(keep, h)
			continue
		}
		batch = append(batch, h)
	}
	s.pending = keep
	if len(keep) > 0 {
		s.armLocked(publishDelay - now.Sub(keep[0].since))
	}
	s.mu.Unlock()
	if len(batch) == 0 {
		return
	}
	n := len(batch)
	var (
		keys, toks    = make([]int64, n), make([]int64, n)
		nss, names    = make([]string, n), make([]string, n)
		slots, limits = make([]int32, n), make([]int32, n)
		since         = make([]time.Time, n)
		owners, metas = make([]string, n), make([]*string, n)
	)
	for i, h := range batch {
		keys[i], toks[i] = h.key, int64(h.token)
		nss[i], names[i] = h.e.prefix, h.name
		slots[i], limits[i] = int32(h.slot), int32(h.limit)
		since[i], owners[i] = h.since, h.opts.Owner
		if len(h.opts.Metadata) > 0 {
			m := jsonObject(h.opts.Metadata)
			metas[i] = &m
		}
	}
	sc := &sessionConn{s: s, c: s.conn, ctx: context.Background(), caller: context.Background()}
	var pid int32
	err := sc.queryRow(s.f.st.publish, []any{keys, toks, nss, names, slots, limits, since, owners, metas}, &pid)
	if err != nil {
		if sc.clean(err) {
			backend.Log(&s.f.opts).Warn("pglock: publishing holders for Inspect failed", "err", err)
			return
		}
		sc.fail(fmt.Errorf("pglock: publishing holders: %w", err))
		return
	}
	if sc.checkPID(pid) != nil {
		return
	}
	for _, h := range batch {
		h.published = true
	}
}

// armHealth starts the periodic health check once a session is open.
func (f *Factory) armHealth() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.closed && f.health == nil {
		f.health = time.AfterFunc(f.cfg.health, f.healthTick)
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
	for _, s := range f.sessions {
		wg.Go(s.check)
	}
	wg.Wait()
	f.mu.Lock()
	defer f.mu.Unlock()
	// A session opening now counts itself before it calls armHealth, so
	// either this sees it or armHealth finds no timer and starts one.
	if !f.closed && f.open.Load() > 0 {
		f.health.Reset(f.cfg.health)
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
	if unused && len(s.waits) == 0 && len(s.marks) == 0 && time.Since(s.lastUsed) > s.f.cfg.idleClose {
		s.failLocked(errors.New("pglock: lock session idle"))
		return
	}
	s.arm()
	sc := &sessionConn{s: s, c: s.conn, ctx: context.Background(), caller: context.Background()}
	var pid int32
	if err := sc.queryRow("SELECT pg_backend_pid()", nil, &pid); err != nil {
		sc.fail(fmt.Errorf("pglock: health check: %w", err))
		return
	}
	sc.checkPID(pid)
}

// close fails the session for Close: its connection is closed, which frees
// its locks, and its holders lose them.
func (s *session) close() {
	select {
	case s.sem <- struct{}{}:
	case <-time.After(s.f.cfg.stmtTimeout):
		s.forceClose()
		s.sem <- struct{}{}
	}
	defer func() { <-s.sem }()
	s.failLocked(lock.ErrClosed)
}
