package pglock

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/ubgo/lock/backend"
)

// listenerIdle is how long the listener stays subscribed after its last
// waiter left, so that a burst of waits does not reconnect each time. Then
// its connection is closed: an idle factory keeps none.
const listenerIdle = time.Second

// waitReg is one waiting Acquire's backend.Subscription: its channel is
// signalled by the listener when another session releases the name, and
// by this factory's own releases and losses of it; the name is marked as
// waited for on its session, so that releases elsewhere notify.
type waitReg struct {
	f      *Factory
	s      *session
	ctx    context.Context // the Acquire's
	key    int64           // the waiters key of the name
	ch     chan struct{}   // buffered 1: the name may be free
	gen    atomic.Uint64   // the session generation its marker was taken on
	marked bool            // guarded by the session
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

// registerWaiter subscribes a waiter for the name whose waiters key is
// key, then marks the name as waited for on its session (the waiters key,
// held shared), so that every release after that point notifies. Without a
// listener (no connection for it) the waiter still works, by polling.
func (f *Factory) registerWaiter(ctx context.Context, s *session, key int64) (*waitReg, error) {
	w := &waitReg{f: f, s: s, ctx: ctx, key: key, ch: make(chan struct{}, 1)}
	f.lis.subscribe(w)
	if err := f.lis.ensure(ctx); err != nil {
		backend.Log(&f.cfg.Options).Warn("pglock: no listener for release notifications; waiters poll", "err", err)
	}
	if err := f.markWaiter(w); err != nil {
		f.lis.unsubscribe(w)
		return nil, err
	}
	return w, nil
}

// Wake returns the waiter's channel. Before each attempt it makes sure a
// release elsewhere still signals it: the listener runs (its connection
// may have ended), and the name is marked on the session's current
// connection (a replaced session lost the marker). Failures leave the
// waiter polling.
func (w *waitReg) Wake() <-chan struct{} {
	if !w.f.lis.isRunning() {
		w.f.lis.ensure(w.ctx)
	}
	if w.s.generation() != w.gen.Load() {
		w.f.markWaiter(w)
	}
	return w.ch
}

// Close ends the wait: the marker is dropped when the last local waiter of
// the name on its session leaves.
func (w *waitReg) Close() {
	w.f.lis.unsubscribe(w)
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
			if sc.clean(err) {
				return err
			}
			return sc.fail(err)
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
				if sc.clean(err) {
					return err
				}
				return sc.fail(err)
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
	c, err := l.f.hijack(ctx)
	if err != nil {
		l.mu.Lock()
		l.failed = time.Now()
		l.mu.Unlock()
		return err
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.f.set.stmtTimeout)
	defer cancel()
	if _, err := c.Exec(sctx, "SELECT set_config('application_name', $1, false)", pgx.QueryExecModeSimpleProtocol, l.f.set.appName); err != nil {
		closeConn(c)
		return err
	}
	if _, err := c.Exec(sctx, "LISTEN "+notifyChannel); err != nil {
		closeConn(c)
		return err
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
