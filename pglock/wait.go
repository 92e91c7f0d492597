package pglock

// The waiting model. A waiting Acquire is a backend.Wait whose
// Subscription is a waiter. A factory's waiters of a name queue first come
// first (entry.queue); only the first is armed, and only it is woken by a
// release, so that a hand-off costs the same however many wait, here or in
// other processes. It is armed in one of two ways, and its attempts ask
// Postgres accordingly:
//
//   - Blocked: a writer or a reader (limit 1) claims a wait session
//     (waitSessions) and its attempt is pg_advisory_lock there, or
//     pg_advisory_lock_shared (mutex_wait*.sql, shared_wait*.sql), in
//     Postgres's queue of the mutex key. Postgres orders the queue: at a
//     release it grants the key to the longest waiting writer, or to every
//     reader queued before the next writer, whose statements return with
//     their tokens; a reader that comes while a writer waits queues behind
//     it. The lock is held on that wait session until it is released.
//   - Notified: semaphores, and writers and readers without a wait session,
//     mark the name on their lock session (the waiters key, held shared; a
//     writer also holds the intent key, which readers give way to, a
//     blocked one before it queues). A release that finds the mark sends
//     NOTIFY; the factory's listener wakes the name's first waiter, whose
//     attempt is a try (one statement), as it is every WithPollInterval.
//
// The first waiter arms at the start of each attempt, before it asks.
// Waiters behind it are woken when they become first; polled before, they
// only check that Postgres answers. A waiting Acquire of a name contended
// here lately makes its first attempt the blocked one (see queued), so
// that a contended acquisition costs two statements, as the raw lock's.
// The guide says why the two ways remain. A waiter's fields belong to its
// waiting goroutine, where Wait calls Wake, the attempt and Close; others
// only signal its channel.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"sync"
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

// waiter is one waiting Acquire: its place in its name's queue and how a
// release reaches it.
type waiter struct {
	*call
	writer bool          // an exclusive mutex waiter: readers give way to it
	single bool          // a writer or a reader (limit 1): may block
	wake   chan struct{} // buffered 1: the name may be free

	ws     *session // blocked: the wait session claimed for it
	notify bool     // notified, for the rest of the wait
	marked keyHold  // notified: the waiters key
	intent keyHold  // notified writer: the intent key
}

// keyHold is a key a notified waiter holds on its lock session, and the
// connection (generation) it holds it on: a replaced session lost it.
type keyHold struct {
	on  bool
	gen uint64
}

// subscribe queues a waiter for the call's name. One that queued before its
// first attempt (see queued) and is first is woken at once, to make it.
func (c *call) subscribe(queued bool) *waiter {
	single := c.o.Limit() == 1
	w := &waiter{call: c, writer: single && !c.o.Shared, single: single, wake: make(chan struct{}, 1)}
	c.f.mu.Lock()
	defer c.f.mu.Unlock()
	e := c.e
	e.queue = append(e.queue, w)
	if queued && e.queue[0] == w {
		w.signal()
	}
	return w
}

// Wake returns the waiter's channel.
func (w *waiter) Wake() <-chan struct{} { return w.wake }

// attempt is the waiter's part of an attempt. The first waiter here arms
// (see arm), then blocks, if it is to; one behind others checks that
// Postgres answers (so that it never reports contention Postgres did not
// confirm lately) and stays in line. asked false: the waiter tries.
func (w *waiter) attempt() (h *Holder, asked bool, err error) {
	if !w.f.first(w) {
		return nil, true, w.inLine()
	}
	if err := w.arm(); err != nil || w.ws == nil {
		return nil, err != nil, err
	}
	ws := w.ws
	h, err = w.block(ws)
	switch {
	case h != nil:
		w.ws = nil // its holder's now
	case errors.Is(err, errNoWait):
		w.f.waits.free(ws)
		w.ws = nil
		err = w.listen()
		return nil, err != nil, err
	}
	return h, true, err
}

// arm makes sure that a release reaches the waiter: blocked if it is a
// writer or a reader and a wait session is free, notified otherwise.
func (w *waiter) arm() error {
	if w.ws != nil {
		return nil
	}
	if w.single {
		if w.ws = w.f.waits.claim(); w.ws != nil {
			return nil
		}
	}
	return w.listen()
}

// inLine asks the name's lock session for its backend pid: the answer of
// a waiter behind others here.
func (w *waiter) inLine() error {
	err := w.s.do(w.ctx, true, func(sc *sessionConn) error {
		var pid int32
		if err := sc.queryRow(w.f.st.health).Scan(&pid); err != nil {
			return sc.failed("waiting", err)
		}
		return sc.checkPID(pid)
	})
	if err != nil {
		return err
	}
	return ErrLocked
}

// Close ends the wait: the waiter leaves its queue (the next, now first, is
// woken), and gives back its wait session and its marks.
func (w *waiter) Close() {
	w.f.leave(w)
	if w.ws != nil {
		w.f.waits.free(w.ws)
	}
	if w.notify {
		w.f.lis.unsubscribe(w)
		w.unmark(&w.intent, w.e.keys.intent, w.f.st.intentDrop)
		w.unmark(&w.marked, w.e.keys.waiters, w.f.st.waiterUnmark)
	}
}

func (w *waiter) signal() {
	select {
	case w.wake <- struct{}{}:
	default: // one is pending already
	}
}

// first reports whether w is the first of its name's waiters here.
func (f *Factory) first(w *waiter) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return w.e.queue[0] == w
}

func (f *Factory) leave(w *waiter) {
	f.mu.Lock()
	defer f.mu.Unlock()
	i := slices.Index(w.e.queue, w)
	w.e.queue = slices.Delete(w.e.queue, i, i+1)
	if i == 0 {
		w.e.wakeFirst()
	}
}

// wakeFirst wakes the name's first waiter here. Factory.mu is held.
func (e *entry) wakeFirst() {
	if len(e.queue) > 0 {
		e.queue[0].signal()
	}
}

// writerWaits reports whether a writer of this factory waits for e.
// Factory.mu is held.
func (e *entry) writerWaits() bool {
	return slices.ContainsFunc(e.queue, func(w *waiter) bool { return w.writer })
}

// queued reports whether a waiting Acquire of e is to queue before its
// first attempt, which would find the name held: others here wait for it,
// or (limit 1) the name was contended here lately: its last release here
// was granted to a waiter blocked in Postgres's queue, or its last holder
// here waited in that queue. Then the first attempt blocks at once, as the
// raw lock does: Postgres grants it at once if the name is free, and the
// try that would fail is saved. The notes are few (one per name, until it
// is acquired again) and are dropped all at once if they pile up.
func (f *Factory) queued(e *entry, single bool) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	busy := f.busy[e.keys.mutex]
	delete(f.busy, e.keys.mutex)
	return len(e.queue) > 0 || busy && single
}

// noteBusy notes that the mutex key was contended (see queued).
// Factory.mu is held.
func (f *Factory) noteBusy(key int64) {
	if len(f.busy) >= 1024 {
		clear(f.busy)
	}
	f.busy[key] = true
}

// errNoWait: the waiter cannot block (no wait session could be opened, it
// ended under the wait, or a writer waiting by notifications turned a
// reader away): it tries on its lock session and is notified, until it can
// block again.
var errNoWait = errors.New("pglock: no wait session")

// block waits for the mutex key on the wait session ws, which holds
// nothing: exclusive for a writer, shared for a reader. Postgres queues the
// waiters of every session on the key and at each release grants it to the
// longest waiting one (a writer), or to every reader queued before the
// next writer, which alone wake; a reader queues behind a waiting writer.
// The statement also takes the token (and writes the holder's row, for a
// call with an owner or metadata). A wait that ends (ctx, Close) cancels
// the statement and then gives the key up, which gives up a grant that
// raced the cancel; a session that fails under the wait is closed, which
// frees whatever it held.
func (w *waiter) block(ws *session) (*Holder, error) {
	f, e := w.f, w.e
	select {
	case ws.sem <- struct{}{}:
	case <-w.ctx.Done():
		return nil, w.ctx.Err()
	}
	defer func() { <-ws.sem }()
	if ws.conn == nil {
		if err := w.openWait(ws); err != nil {
			return nil, err
		}
	}
	raw, pid, waited, err := w.grant(ws)
	sctx, cancel := context.WithTimeout(context.Background(), f.set.stmtTimeout)
	defer cancel()
	sc := &sessionConn{s: ws, c: ws.conn, ctx: sctx}
	switch {
	case err != nil && !sc.clean(err):
		sc.fail(sc.wrap("waiting", err)) // frees whatever it held
		if err := w.ended(); err != nil {
			return nil, err
		}
		return nil, errNoWait
	case w.ended() != nil:
		// Granted or not, the key is given up, with a row written for it.
		exclusive, shared := []int64{e.keys.mutex}, int64(0)
		if w.o.Shared {
			exclusive, shared = nil, e.keys.mutex
		}
		if _, err := sc.c.Exec(sc.ctx, f.st.abandon, exclusive, shared, shared != 0); err != nil {
			sc.fail(sc.wrap("giving up a wait", err))
		}
		return nil, w.ended()
	case err == nil && raw == tryHeld && w.o.Shared:
		// A writer waiting by notifications holds the intent key: the
		// reader did not queue, and waits for that writer's release.
		if err := sc.checkPID(pid); err != nil {
			return nil, err
		}
		return nil, errNoWait
	}
	tok, err := w.tokenOf(sc, raw, pid, err)
	if err != nil {
		return nil, err
	}
	if waited {
		f.mu.Lock()
		f.noteBusy(e.keys.mutex)
		f.mu.Unlock()
	}
	return w.admit(permit{s: ws, key: e.keys.mutex, token: tok}), nil
}

// grant runs mutex_wait.sql (shared_wait.sql for a reader) on ws (sem
// held) until Postgres grants the key, or the wait ends: the statement runs
// without a deadline, and the end of ctx cancels it on the server (see
// cancelOnEnd); Close closes the session.
func (w *waiter) grant(ws *session) (raw int64, pid int32, waited bool, err error) {
	sc := &sessionConn{s: ws, c: ws.conn, ctx: context.Background()}
	returned := cancelOnEnd(w.ctx, sc.c.PgConn(), ws.forceClose, w.f.set.connectTimeout)
	stopClose := context.AfterFunc(w.f.life, ws.forceClose)
	q, args := w.stmt(w.f.st.mutexWait, w.f.st.mutexWaitRow)
	if w.o.Shared {
		q, args = w.stmt(w.f.st.sharedWait, w.f.st.sharedWaitRow, w.e.keys.intent)
	}
	err = sc.queryRow(q, args...).Scan(&raw, &pid)
	returned()
	stopClose()
	if raw < tryMarker {
		raw, waited = -raw, true // a token taken after waiting in the queue
	}
	return raw, pid, waited, err
}

// ended is the error of a wait that ended: Close, or ctx.
func (w *waiter) ended() error {
	if w.f.isClosed() {
		return lock.ErrClosed
	}
	return w.ctx.Err()
}

// openWait connects the wait session ws (sem held), if the pool has a
// connection to spare now: the notified waiting needs none.
func (w *waiter) openWait(ws *session) error {
	f := w.f
	st := f.pool.Stat()
	switch {
	case f.isClosed():
		return lock.ErrClosed
	case st.AcquiredConns() >= st.MaxConns():
		return errNoWait
	}
	err := ws.open(w.ctx)
	if err != nil && w.ctx.Err() != nil {
		return w.ctx.Err()
	}
	if err == nil {
		err = f.watchClient(ws)
	}
	if err != nil {
		backend.Log(&f.cfg.Options).Debug("pglock: no wait session; waiting for notifications", "err", err)
		f.waits.unusable()
		return errNoWait
	}
	return nil
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

// watchClient prepares a new wait session, whose statement may wait for
// long without a byte in either direction, for the other side's end: the
// kernel probes the connection, so that on a silently cut network the wait
// fails after a few health intervals instead of never, and the session
// asks Postgres to check the client as often (wait_session.sql).
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
		if _, err := sc.c.Exec(sc.ctx, f.st.waitSession, ms); err != nil {
			return sc.fail(fmt.Errorf("pglock: opening a wait session: %w", err))
		}
		return nil
	})
}

// listen arms the waiter by notifications, which it stays: it is
// subscribed to the listener, which is made to run (its connection may
// have ended), and the name is marked on the lock session's current
// connection, with the intent key for a writer.
func (w *waiter) listen() error {
	if !w.notify {
		w.notify = true
		w.f.lis.subscribe(w)
	}
	if !w.f.lis.isRunning() {
		if err := w.f.lis.ensure(w.ctx); err != nil {
			backend.Log(&w.f.cfg.Options).Warn("pglock: no listener for release notifications; waiters poll", "err", err)
		}
	}
	if err := w.mark(&w.marked, w.e.keys.waiters, w.f.st.waiterMark); err != nil || !w.writer {
		return err
	}
	return w.mark(&w.intent, w.e.keys.intent, w.f.st.intentTake)
}

// mark takes key for the waiter on its lock session with the statement
// take (waiter_mark.sql, intent_take.sql), unless the session holds it for
// another waiter here already; counted per session, it is unlocked when the
// last of them leaves. An intent key another session holds is not taken:
// the writer's next arming tries again.
func (w *waiter) mark(k *keyHold, key int64, take string) error {
	if k.on && k.gen == w.s.generation() {
		return nil
	}
	return w.s.do(w.ctx, true, func(sc *sessionConn) error {
		s := sc.s
		if k.on && k.gen == s.gen {
			return nil
		}
		*k = keyHold{gen: s.gen}
		if s.waits[key] == 0 {
			var (
				ok  bool
				pid int32
			)
			if err := sc.queryRow(take, key).Scan(&ok, &pid); err != nil {
				return sc.failed("waiting", err)
			}
			if err := sc.checkPID(pid); err != nil || !ok {
				return err
			}
		}
		s.waits[key]++
		k.on = true
		return nil
	})
}

// unmark gives back what mark took, with the statement give.
func (w *waiter) unmark(k *keyHold, key int64, give string) {
	if !k.on {
		return
	}
	// The wait may have ended with its context.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(w.ctx), w.f.set.stmtTimeout)
	defer cancel()
	w.s.do(ctx, false, func(sc *sessionConn) error {
		s := sc.s
		if k.gen != s.gen {
			return nil // gone with the connection
		}
		k.on = false
		if s.waits[key]--; s.waits[key] > 0 {
			return nil
		}
		delete(s.waits, key)
		var pid int32
		if err := sc.queryRow(give, key).Scan(nil, &pid); err != nil {
			return sc.failed("waiting", err)
		}
		return sc.checkPID(pid)
	})
}

// waitSessions are the sessions blocked waiters wait on, each then held
// by the holder its wait got until that ends. Its mutex guards which are
// claimed, and when opening one last failed.
type waitSessions struct {
	all  []*session
	poll time.Duration // how long after a failed open none is claimed

	mu      sync.Mutex
	claimed map[*session]bool
	failed  time.Time
}

// claim returns a free wait session, or nil.
func (p *waitSessions) claim() *session {
	p.mu.Lock()
	defer p.mu.Unlock()
	if time.Since(p.failed) < p.poll {
		return nil
	}
	for _, s := range p.all {
		if !p.claimed[s] {
			if p.claimed == nil {
				p.claimed = map[*session]bool{}
			}
			p.claimed[s] = true
			return s
		}
	}
	return nil
}

// free gives s back, if it is a claimed wait session.
func (p *waitSessions) free(s *session) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.claimed, s)
}

// unusable notes that a wait session could not be opened.
func (p *waitSessions) unusable() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.failed = time.Now()
}

// listener owns the connection that LISTENs for release notifications
// while this factory has notified waiters, and wakes them.
type listener struct {
	f *Factory

	startMu sync.Mutex // serialises start and stop

	mu      sync.Mutex
	running bool
	stop    context.CancelFunc
	done    chan struct{}
	subs    map[int64]map[*waiter]struct{} // by waiters key
	n       int
	idle    *time.Timer
	closed  bool
	failed  time.Time // when starting last failed: retried once per poll interval
}

func newListener(f *Factory) *listener {
	return &listener{f: f, subs: map[int64]map[*waiter]struct{}{}}
}

func (l *listener) subscribe(w *waiter) {
	l.mu.Lock()
	defer l.mu.Unlock()
	key := w.e.keys.waiters
	m := l.subs[key]
	if m == nil {
		m = map[*waiter]struct{}{}
		l.subs[key] = m
	}
	m[w] = struct{}{}
	l.n++
	if l.idle != nil {
		l.idle.Stop()
		l.idle = nil
	}
}

func (l *listener) unsubscribe(w *waiter) {
	l.mu.Lock()
	defer l.mu.Unlock()
	key := w.e.keys.waiters
	m := l.subs[key]
	if _, ok := m[w]; !ok {
		return
	}
	delete(m, w)
	if len(m) == 0 {
		delete(l.subs, key)
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
			// Waiters poll until a new listener starts.
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
		w.signal()
	}
}

// broadcast wakes every notified waiter, to arm and try again.
func (l *listener) broadcast() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, m := range l.subs {
		for w := range m {
			w.signal()
		}
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
