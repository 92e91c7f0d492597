package pglock

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/ubgo/lock"
	"github.com/ubgo/lock/backend"
)

// listenerIdle is how long the listener stays subscribed after its last
// waiter left, so that a burst of waits does not reconnect each time. Then
// its connection is closed: an idle factory keeps none.
const listenerIdle = time.Second

// errNoWaitSession: no wait session could be had; the waiter falls back
// to notified retries.
var errNoWaitSession = errors.New("pglock: no wait session")

// waitReg is one waiting Acquire's backend.Subscription and its place in
// its name's queue of this factory's waiters. Its channel is signalled
// when it becomes the first of the queue and by this factory's own
// releases and losses of the name; in notify mode (see listen) also by the
// listener when another session releases the name, which the waiter marks
// as waited for on its session so that releases elsewhere notify.
type waitReg struct {
	f      *Factory
	s      *session
	e      *entry
	ctx    context.Context // the Acquire's
	key    int64           // the waiters key of the name
	ch     chan struct{}   // buffered 1: the name may be free
	notify bool            // listen was called; only the waiting goroutine uses it
	gen    atomic.Uint64   // the session generation its marker was taken on
	marked bool            // guarded by the session
	writer bool            // an exclusive Acquire of a mutex: readers give way to it
	intent bool            // holds the intent key on its session (holdIntent); guarded by the session
	igen   uint64          // the session generation of intent; guarded by the session
}

// listener owns the connection that LISTENs for release notifications
// while this factory has waiters, and fans them out.
type listener struct {
	f *Factory

	startMu sync.Mutex // serialises start and stop

	mu      sync.Mutex
	running bool
	stop    context.CancelFunc
	done    chan struct{}
	subs    map[int64]map[*waitReg]struct{}
	n       int
	idle    *time.Timer
	closed  bool
	failed  time.Time // when starting last failed: retried once per poll interval
}

func newListener(f *Factory) *listener {
	return &listener{f: f, subs: map[int64]map[*waitReg]struct{}{}}
}

// subscribe queues a waiter for e. A queued waiter (one that made no
// attempt yet) that finds itself first is woken at once.
func (f *Factory) subscribe(ctx context.Context, s *session, e *entry, queued, writer bool) *waitReg {
	w := &waitReg{f: f, s: s, e: e, ctx: ctx, key: e.keys.waiters, ch: make(chan struct{}, 1), writer: writer}
	f.lis.subscribe(w)
	f.mu.Lock()
	e.queue = append(e.queue, w)
	if queued && e.queue[0] == w {
		w.wake()
	}
	f.mu.Unlock()
	return w
}

// turn reports whether w is the first of its name's waiters in this
// factory, which alone makes attempts; if so, and it waits for a mutex
// exclusively (blocks), it claims a free wait session for w to block on
// (nil: none).
func (f *Factory) turn(w *waitReg, blocks bool) (first bool, ws *session) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if w.e.queue[0] != w {
		return false, nil
	}
	if !blocks || time.Since(f.noWait) < f.set.poll {
		return true, nil
	}
	for _, s := range f.waits {
		if !s.claimed {
			s.claimed = true
			return true, s
		}
	}
	return true, nil
}

// block waits for the mutex of e on the wait session ws, which holds
// nothing: Postgres queues the waiters of every session on the key and, at
// each release, grants it to the longest waiting one, which alone wakes.
// The grant's statement also takes the token. The lock is then held on ws,
// which stays claimed by its holder until it is released or lost: a
// factory blocks on, and holds through, at most WithWaitSessions
// connections. A wait that ends (ctx, Close) cancels the statement and
// then unlocks the key, which gives up a grant that raced the cancel; a
// session that fails under the wait is closed, which frees whatever it
// held. It returns errNoWaitSession when ws cannot be opened or ended
// under the wait: the waiter then tries on its lock session.
func (f *Factory) block(ctx context.Context, ws *session, e *entry, o *lock.Options) (*Holder, error) {
	h, err := f.blockOn(ctx, ws, e, o)
	if h == nil {
		f.mu.Lock()
		ws.claimed = false
		if errors.Is(err, errNoWaitSession) {
			f.noWait = time.Now()
		}
		f.mu.Unlock()
	}
	if errors.Is(err, errWaitLost) {
		err = errNoWaitSession // the waiter tries on its lock session instead
	}
	return h, err
}

// cancelOnEnd cancels on the server, when ctx ends, the statement about to
// run on pc. A cancel request that arrives before the statement started
// is ignored (ctx may end just as it is sent), so the request is sent
// again until the statement returns; if a request fails, or the statement
// has not returned within timeout, closeConn ends it. The returned func is
// called once the statement returned: after it no request is on its way,
// so none can hit a later statement.
func cancelOnEnd(ctx context.Context, pc *pgconn.PgConn, closeConn func(), timeout time.Duration) (returned func()) {
	done, finished := make(chan struct{}), make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		defer close(finished)
		giveUp := time.Now().Add(timeout)
		for wait := time.Millisecond; ; wait = min(2*wait, 100*time.Millisecond) {
			cctx, cancel := context.WithTimeout(context.Background(), timeout)
			err := pc.CancelRequest(cctx)
			cancel()
			if err != nil || time.Now().After(giveUp) {
				closeConn()
				return
			}
			select {
			case <-done:
				return
			case <-time.After(wait):
			}
		}
	})
	return func() {
		close(done)
		if !stop() {
			<-finished
		}
	}
}

// errWaitLost: the wait session ended under the wait.
var errWaitLost = errors.New("pglock: wait session ended")

func (f *Factory) blockOn(ctx context.Context, ws *session, e *entry, o *lock.Options) (*Holder, error) {
	select {
	case ws.sem <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	defer func() { <-ws.sem }()
	if ws.conn == nil {
		// A wait session is worth a connection only if the pool has one
		// to spare now: the notified retries need none.
		st := f.pool.Stat()
		switch {
		case f.isClosed():
			return nil, lock.ErrClosed
		case st.AcquiredConns() >= st.MaxConns():
			return nil, errNoWaitSession
		}
		if err := ws.open(ctx); err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			backend.Log(&f.cfg.Options).Debug("pglock: no wait session; waiting for notifications", "err", err)
			return nil, errNoWaitSession
		}
		if err := f.watchClient(ws); err != nil {
			backend.Log(&f.cfg.Options).Debug("pglock: no wait session; waiting for notifications", "err", err)
			return nil, errNoWaitSession
		}
	}
	pub := o.Owner != "" || len(o.Metadata) > 0
	q, args := f.mutexStatement(e, o, pub, true)
	sc := &sessionConn{s: ws, c: ws.conn, ctx: context.Background()}
	// The statement runs without a deadline: ctx's end cancels it on the
	// server (see cancelOnEnd).
	returned := cancelOnEnd(ctx, sc.c.PgConn(), ws.forceClose, f.set.connectTimeout)
	stopClose := context.AfterFunc(f.life, ws.forceClose)
	var (
		tok int64
		pid int32
	)
	err := sc.queryRow(q, args...).Scan(&tok, &pid)
	returned()
	stopClose()
	sctx, cancel := context.WithTimeout(context.Background(), f.set.stmtTimeout)
	defer cancel()
	sc.ctx = sctx
	ended := func() error {
		if f.isClosed() {
			return lock.ErrClosed
		}
		return ctx.Err()
	}
	switch {
	case err != nil && !sc.clean(err):
		sc.fail(sc.wrap("waiting", err)) // frees whatever it held
		if err := ended(); err != nil {
			return nil, err
		}
		return nil, errWaitLost
	case ended() != nil:
		// Granted or not, the key is given up, with a row written for it.
		if _, err := sc.c.Exec(sc.ctx, f.st.unlock, []int64{e.keys.mutex}, int64(0), false); err != nil {
			sc.fail(sc.wrap("giving up a wait", err))
		}
		return nil, ended()
	}
	if tok, err = f.mutexResult(sc, e, pub, tok, pid, err, false); err != nil {
		return nil, err
	}
	return f.hold(ctx, ws, e, e.keys.mutex, 0, 1, tok, pub, o), nil
}

// watchClient prepares a new wait session, whose statement may wait for
// long without a byte in either direction, for the other side's end. The
// kernel probes the connection, so that on a silently cut network the wait
// fails after a few health intervals instead of never. Its wait is bounded
// by the caller, not by timeouts the pool's connections may set. And
// Postgres checks
// every health interval that the client is still there
// (client_connection_check_interval, PostgreSQL 14 and later): a waiting
// process that was killed leaves the queue then, instead of only when its
// turn comes and the grant's reply finds nobody.
func (f *Factory) watchClient(ws *session) error {
	nc := ws.conn.PgConn().Conn()
	if u, ok := nc.(interface{ NetConn() net.Conn }); ok {
		nc = u.NetConn()
	}
	if tc, ok := nc.(*net.TCPConn); ok {
		d := f.set.health
		tc.SetKeepAliveConfig(net.KeepAliveConfig{Enable: true, Idle: d, Interval: d, Count: 3})
	}
	ms := strconv.FormatInt(max(f.set.health.Milliseconds(), 1), 10)
	return ws.use(context.Background(), func(sc *sessionConn) error {
		if _, err := sc.c.Exec(sc.ctx, `SELECT set_config('statement_timeout', '0', false), set_config('lock_timeout', '0', false),
			(SELECT set_config(name, $1, false) FROM pg_settings WHERE name = 'client_connection_check_interval')`, ms); err != nil {
			return sc.fail(fmt.Errorf("pglock: opening a wait session: %w", err))
		}
		return nil
	})
}

// listen puts the first waiter into notify mode, which it stays in: the
// listener runs, and the name is marked as waited for on its session, so
// that every release after that point notifies. Without a listener (no
// connection for it) the waiter still works, by polling.
func (w *waitReg) listen() error {
	if w.notify {
		return nil
	}
	w.notify = true
	if err := w.f.lis.ensure(w.ctx); err != nil {
		backend.Log(&w.f.cfg.Options).Warn("pglock: no listener for release notifications; waiters poll", "err", err)
	}
	return w.f.markWaiter(w)
}

// Wake returns the waiter's channel. In notify mode it first makes sure a
// release elsewhere still signals it: the listener runs (its connection
// may have ended), and the name is marked on the session's current
// connection (a replaced session lost the marker). Failures leave the
// waiter polling.
func (w *waitReg) Wake() <-chan struct{} {
	if w.notify {
		if !w.f.lis.isRunning() {
			w.f.lis.ensure(w.ctx)
		}
		if w.s.generation() != w.gen.Load() {
			w.f.markWaiter(w)
		}
	}
	return w.ch
}

// Close ends the wait: the next waiter of the queue is woken if this one
// was first, and the marker is dropped when the last local waiter of the
// name on its session leaves.
func (w *waitReg) Close() {
	f := w.f
	f.mu.Lock()
	i := slices.Index(w.e.queue, w)
	w.e.queue = slices.Delete(w.e.queue, i, i+1)
	if i == 0 && len(w.e.queue) > 0 {
		w.e.queue[0].wake()
	}
	f.mu.Unlock()
	f.lis.unsubscribe(w)
	f.dropIntent(w)
	if !w.marked {
		return
	}
	// The wait may have ended with its context.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(w.ctx), w.f.set.stmtTimeout)
	defer cancel()
	w.s.do(ctx, false, func(sc *sessionConn) error {
		if sc.s.gen != w.gen.Load() {
			return nil // the session, and its marker, are gone
		}
		s := sc.s
		s.waits[w.key]--
		if s.waits[w.key] > 0 {
			return nil
		}
		delete(s.waits, w.key)
		var pid int32
		if err := sc.queryRow("SELECT pg_advisory_unlock_shared($1::int8), pg_backend_pid()", w.key).Scan(nil, &pid); err != nil {
			return sc.failed("waiting", err)
		}
		return sc.checkPID(pid)
	})
}

// holdIntent takes the name's intent key for w, a writer that waits in
// notify mode (not blocked in Postgres's queue of the key, which keeps
// readers out by itself), unless its session holds it for another of its
// writers: a shared Acquire finds it held and waits behind the writer
// (WithShared). Held by another session's writer, it is tried again at
// w's next attempt. It goes with the session, so a killed process frees
// it.
func (f *Factory) holdIntent(w *waitReg) error {
	return w.s.do(w.ctx, true, func(sc *sessionConn) error {
		s, k := sc.s, w.e.keys.intent
		if w.intent && w.igen == s.gen {
			return nil
		}
		w.intent, w.igen = false, s.gen
		if s.waits[k] == 0 {
			var ok bool
			var pid int32
			if err := sc.queryRow("SELECT pg_try_advisory_lock($1::int8), pg_backend_pid()", k).Scan(&ok, &pid); err != nil {
				return sc.failed("waiting", err)
			}
			if err := sc.checkPID(pid); err != nil || !ok {
				return err
			}
		}
		s.waits[k]++
		w.intent = true
		return nil
	})
}

// dropIntent gives up w's hold of the intent key, unlocking it when w was
// its session's last writer holding it.
func (f *Factory) dropIntent(w *waitReg) {
	if !w.intent { // set and cleared only by the waiting goroutine, which calls Close
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(w.ctx), f.set.stmtTimeout)
	defer cancel()
	w.s.do(ctx, false, func(sc *sessionConn) error {
		s, k := sc.s, w.e.keys.intent
		if !w.intent || w.igen != s.gen {
			return nil // never held, or gone with the session
		}
		w.intent = false
		if s.waits[k]--; s.waits[k] > 0 {
			return nil
		}
		delete(s.waits, k)
		var pid int32
		if err := sc.queryRow("SELECT pg_advisory_unlock($1::int8), pg_backend_pid()", k).Scan(nil, &pid); err != nil {
			return sc.failed("waiting", err)
		}
		return sc.checkPID(pid)
	})
}

// markWaiter takes the waiters marker for w on the session's current
// connection, unless it holds it already.
func (f *Factory) markWaiter(w *waitReg) error {
	return w.s.do(w.ctx, true, func(sc *sessionConn) error {
		s := sc.s
		if w.marked && w.gen.Load() == s.gen {
			return nil
		}
		w.marked = false
		w.gen.Store(s.gen)
		if s.waits[w.key] == 0 {
			var pid int32
			if err := sc.queryRow("SELECT pg_backend_pid() FROM pg_advisory_lock_shared($1::int8)", w.key).Scan(&pid); err != nil {
				return sc.failed("waiting", err)
			}
			if err := sc.checkPID(pid); err != nil {
				return err
			}
		}
		s.waits[w.key]++
		w.marked = true
		return nil
	})
}

func (l *listener) subscribe(w *waitReg) {
	l.mu.Lock()
	defer l.mu.Unlock()
	m := l.subs[w.key]
	if m == nil {
		m = map[*waitReg]struct{}{}
		l.subs[w.key] = m
	}
	m[w] = struct{}{}
	l.n++
	if l.idle != nil {
		l.idle.Stop()
		l.idle = nil
	}
}

func (l *listener) unsubscribe(w *waitReg) {
	l.mu.Lock()
	defer l.mu.Unlock()
	m := l.subs[w.key]
	if _, ok := m[w]; !ok {
		return
	}
	delete(m, w)
	if len(m) == 0 {
		delete(l.subs, w.key)
	}
	l.n--
	if l.n == 0 && l.running && l.idle == nil && !l.closed {
		l.idle = time.AfterFunc(listenerIdle, l.stopIfIdle)
	}
}

// ensure starts listening unless it already does.
func (l *listener) ensure(ctx context.Context) error {
	l.startMu.Lock()
	defer l.startMu.Unlock()
	l.mu.Lock()
	running, closed, failed := l.running, l.closed, l.failed
	l.mu.Unlock()
	if running || closed || time.Since(failed) < l.f.set.poll {
		return nil
	}
	c, err := l.f.hijack(ctx, "waiting: opening the listener")
	if err != nil {
		l.mu.Lock()
		l.failed = time.Now()
		l.mu.Unlock()
		return err
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.f.set.stmtTimeout)
	defer cancel()
	_, err = c.Exec(sctx, "SELECT set_config('application_name', $1, false)", pgx.QueryExecModeSimpleProtocol, l.f.set.appName)
	if err == nil {
		_, err = c.Exec(sctx, "LISTEN "+notifyChannel)
	}
	if err != nil {
		closeConn(c)
		return fmt.Errorf("pglock: waiting: opening the listener: %w", err)
	}
	lctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	l.mu.Lock()
	l.running, l.stop, l.done = true, stop, done
	l.mu.Unlock()
	go l.loop(lctx, c, done)
	// Anything released before LISTEN took effect went unnoticed.
	l.broadcast()
	return nil
}

func (l *listener) isRunning() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.running || l.closed
}

func (l *listener) loop(ctx context.Context, c *pgx.Conn, done chan struct{}) {
	defer close(done)
	for {
		n, err := c.WaitForNotification(ctx)
		if err != nil {
			// Failed, or asked to stop (idle or Close): the connection
			// goes, and with it the LISTEN.
			closeConn(c)
			l.mu.Lock()
			l.running = false
			l.mu.Unlock()
			// Waiters fall back to polling until a new listener starts.
			l.broadcast()
			return
		}
		if n.Channel != notifyChannel {
			continue
		}
		key, err := strconv.ParseInt(n.Payload, 10, 64)
		if err != nil {
			continue
		}
		l.signal(key)
	}
}

// signal wakes the waiters of the name whose waiters key is key.
func (l *listener) signal(key int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for w := range l.subs[key] {
		w.wake()
	}
}

// broadcast wakes every waiter, to try again.
func (l *listener) broadcast() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, m := range l.subs {
		for w := range m {
			w.wake()
		}
	}
}

func (w *waitReg) wake() {
	select {
	case w.ch <- struct{}{}:
	default: // one is pending already
	}
}

func (l *listener) stopIfIdle() {
	l.startMu.Lock()
	defer l.startMu.Unlock()
	l.mu.Lock()
	l.idle = nil
	if l.n > 0 || !l.running {
		l.mu.Unlock()
		return
	}
	stop, done := l.stop, l.done
	l.mu.Unlock()
	stop()
	<-done
}

// close stops listening, which closes the connection.
func (l *listener) close() {
	l.startMu.Lock()
	defer l.startMu.Unlock()
	l.mu.Lock()
	l.closed = true
	if l.idle != nil {
		l.idle.Stop()
		l.idle = nil
	}
	running, stop, done := l.running, l.stop, l.done
	l.mu.Unlock()
	if running {
		stop()
		<-done // the loop closes the connection
	}
}
