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

// waitReg is one waiting Acquire.
type waitReg struct {
	key    int64         // the waiters key of the name
	ch     chan struct{} // buffered 1: a release notification arrived
	gen    atomic.Uint64 // the session generation its marker was taken on
	marked bool          // guarded by the session
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

// registerWaiter subscribes w to notifications, then marks the name as
// waited for on its session (the waiters key, held shared), so that every
// release after that point notifies. Without a listener (no connection for
// it) the waiter still works, by polling.
func (f *Factory) registerWaiter(ctx context.Context, s *session, w *waitReg) error {
	f.lis.subscribe(w)
	if err := f.lis.ensure(ctx); err != nil {
		backend.Log(&f.opts).Warn("pglock: no listener for release notifications; waiters poll", "err", err)
	}
	return f.markWaiter(ctx, s, w)
}

// markWaiter takes the waiters marker for w on the session's current
// connection, unless it holds it already.
func (f *Factory) markWaiter(ctx context.Context, s *session, w *waitReg) error {
	return s.do(ctx, true, func(sc *sessionConn) error {
		if w.marked && w.gen.Load() == s.gen {
			return nil
		}
		w.marked = false
		w.gen.Store(s.gen)
		if s.waits[w.key] == 0 {
			var pid int32
			if err := sc.queryRow("SELECT pg_backend_pid() FROM pg_advisory_lock_shared($1::int8)", []any{w.key}, &pid); err != nil {
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

// unregisterWaiter undoes registerWaiter; the marker is dropped when the
// last local waiter of the name on its session leaves.
func (f *Factory) unregisterWaiter(ctx context.Context, s *session, w *waitReg) {
	f.lis.unsubscribe(w)
	if !w.marked {
		return
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), f.cfg.stmtTimeout)
	defer cancel()
	s.do(rctx, false, func(sc *sessionConn) error {
		if s.gen != w.gen.Load() {
			return nil // the session, and its marker, are gone
		}
		s.waits[w.key]--
		if s.waits[w.key] > 0 {
			return nil
		}
		delete(s.waits, w.key)
		var pid int32
		if err := sc.queryRow("SELECT pg_advisory_unlock_shared($1::int8), pg_backend_pid()", []any{w.key}, new(bool), &pid); err != nil {
			if sc.clean(err) {
				return err
			}
			return sc.fail(err)
		}
		return sc.checkPID(pid)
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
	if running || closed || time.Since(failed) < l.f.cfg.poll {
		return nil
	}
	c, err := l.f.hijack(ctx)
	if err != nil {
		l.mu.Lock()
		l.failed = time.Now()
		l.mu.Unlock()
		return err
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.f.cfg.stmtTimeout)
	defer cancel()
	if _, err := c.Exec(sctx, "SELECT set_config('application_name', $1, false)", pgx.QueryExecModeSimpleProtocol, l.f.cfg.appName); err != nil {
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
		l.mu.Lock()
		for w := range l.subs[key] {
			select {
			case w.ch <- struct{}{}:
			default:
			}
		}
		l.mu.Unlock()
	}
}

// broadcast wakes every waiter, to try again.
func (l *listener) broadcast() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, m := range l.subs {
		for w := range m {
			select {
			case w.ch <- struct{}{}:
			default:
			}
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
