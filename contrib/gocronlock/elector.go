package gocronlock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ubgo/lock"
)

// Elector implements gocron.Elector: the replica that holds one named lock
// is the leader, and only the leader's scheduler runs jobs.
//
//	el := gocronlock.NewElector(locks.AsLocker(), "billing-scheduler")
//	defer el.Close()
//	s, err := gocron.NewScheduler(gocron.WithDistributedElector(el))
//
// It campaigns in the background from NewElector until Close with
// lock.Lead: it tries to acquire the lock (every WithRetryInterval, or
// blocking when the Locker was built with WithWait), keeps it while it is
// held (the family's AsLocker holders renew their leases), and campaigns
// again after losing it. IsLeader reads the holder's state on every call,
// so leadership ends the moment the holder reports the lock lost, without
// waiting for the campaign.
type Elector struct {
	l      lock.Locker
	name   string // the lock name: prefix + the given name
	cfg    config
	err    error // bad construction; reported by IsLeader
	cancel context.CancelFunc
	done   chan struct{} // closed when the campaign loop has ended

	mu       sync.Mutex
	won      lock.Holder // the lock the campaign just acquired, for lead
	h        lock.Holder // the held lock, or nil
	since    time.Time   // when h was acquired
	last     error       // why the last campaign did not win
	closed   bool
	closeErr error
}

// NewElector starts campaigning for the lock named prefix + name on l. An
// invalid option or name, a nil l, or an l that reports (lock.Configured)
// an invalid configuration is reported by IsLeader (and Close), and no
// campaign starts. l may wait (WithWait).
func NewElector(l lock.Locker, name string, opts ...Option) *Elector {
	c := resolve(opts)
	e := &Elector{l: l, name: c.prefix + name, cfg: c, done: make(chan struct{})}
	e.err = errors.Join(c.errs...)
	if l == nil {
		e.err = errors.Join(e.err, fmt.Errorf("gocronlock: %w: nil lock.Locker", lock.ErrInvalidOption))
	}
	if bc, ok := l.(lock.Configured); ok {
		if _, err := bc.Config(); err != nil {
			e.err = errors.Join(e.err, fmt.Errorf("gocronlock: lock.Locker configuration: %w", err))
		}
	}
	if name == "" {
		e.err = errors.Join(e.err, fmt.Errorf("gocronlock: %w: empty elector name", lock.ErrInvalidName))
	} else if err := lock.ValidateName(e.name); err != nil {
		e.err = errors.Join(e.err, fmt.Errorf("gocronlock: %w", err))
	}
	if e.err != nil {
		close(e.done)
		e.cancel = func() {}
		return e
	}
	ctx, cancel := context.WithCancel(context.Background())
	e.cancel = cancel
	go func() {
		defer close(e.done)
		// The retry doubles after failures in Lead; capping it at the
		// retry interval keeps WithRetryInterval the one wait.
		err := lock.Lead(ctx, lock.LockerFunc(e.acquire), e.name, e.lead,
			lock.WithLeadRetry(c.retry), lock.WithLeadMaxBackoff(c.retry), lock.WithLeadLogger(c.log()))
		if ctx.Err() == nil { // an error no campaign can fix
			e.mu.Lock()
			e.last = err
			e.mu.Unlock()
		}
	}()
	return e
}

// acquire is one campaign of Lead: it notes why a campaign did not win,
// and hands lead the holder.
func (e *Elector) acquire(ctx context.Context, name string) (lock.Holder, error) {
	h, err := e.l.Acquire(ctx, name)
	e.mu.Lock()
	defer e.mu.Unlock()
	if err != nil {
		if ctx.Err() == nil {
			e.last = err
		}
		return nil, err
	}
	e.won = h
	return leaderHolder{Holder: h, e: e, ctx: ctx}, nil
}

// leaderHolder is the holder Lead releases: the release at Close is what
// Close reports.
type leaderHolder struct {
	lock.Holder
	e   *Elector
	ctx context.Context // the campaign's; ended by Close
}

func (h leaderHolder) Release() error {
	err := h.Holder.Release()
	if h.ctx.Err() != nil {
		h.e.mu.Lock()
		h.e.closeErr = err
		h.e.mu.Unlock()
	}
	return err
}

// lead is Lead's work: this replica is the leader until ctx ends, because
// the lock was lost or Close was called.
func (e *Elector) lead(ctx context.Context, _ uint64) error {
	e.mu.Lock()
	h := e.won
	e.won, e.h, e.since, e.last = nil, h, time.Now(), nil
	e.mu.Unlock()
	<-ctx.Done()
	e.mu.Lock()
	e.h, e.last = nil, h.Err()
	e.mu.Unlock()
	return nil
}

// IsLeader returns nil while this replica holds the leader lock (and has
// held it for the takeover delay). Otherwise its error matches
// ErrNotLeader, and also lock.ErrLocked when another replica holds the
// lock; a backend failure or a lost lock is wrapped as well. gocron calls it
// before every run; the context is not used.
func (e *Elector) IsLeader(context.Context) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	switch {
	case e.err != nil:
		return fmt.Errorf("%w: %w", ErrNotLeader, e.err)
	case e.closed:
		return fmt.Errorf("%w: %w", ErrNotLeader, lock.ErrClosed)
	case e.h != nil:
		select {
		case <-e.h.Done():
			if err := e.h.Err(); err != nil {
				return fmt.Errorf("%w: %w", ErrNotLeader, err)
			}
			return ErrNotLeader
		default:
		}
		if time.Since(e.since) < e.cfg.takeover {
			return fmt.Errorf("%w: taking over", ErrNotLeader)
		}
		return nil
	case e.last != nil:
		return fmt.Errorf("%w: %w", ErrNotLeader, e.last)
	}
	return ErrNotLeader
}

// Holder returns the leader lock while IsLeader would return nil, and nil
// otherwise. Its Token grows with every change of leader (a leadership
// epoch) and its Done closes when leadership ends.
func (e *Elector) Holder() lock.Holder {
	if e.IsLeader(context.Background()) != nil {
		return nil
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.h
}

// LeaderContext returns a context derived from ctx that is cancelled, with
// a cause matching ErrNotLeader, when this replica stops being the leader;
// if it is not the leader now, the context is cancelled already. A job
// passes it on so that work started as leader stops when leadership is
// lost.
func (e *Elector) LeaderContext(ctx context.Context) (context.Context, context.CancelFunc) {
	cctx, cancel := context.WithCancelCause(ctx)
	if err := e.IsLeader(ctx); err != nil {
		cancel(err)
		return cctx, func() { cancel(nil) }
	}
	e.mu.Lock()
	h := e.h
	e.mu.Unlock()
	if h == nil { // lost between the two looks
		cancel(ErrNotLeader)
		return cctx, func() { cancel(nil) }
	}
	go func() {
		select {
		case <-h.Done():
			cause := ErrNotLeader
			if err := h.Err(); err != nil {
				cause = fmt.Errorf("%w: %w", ErrNotLeader, err)
			}
			cancel(cause)
		case <-e.done:
			cancel(fmt.Errorf("%w: %w", ErrNotLeader, lock.ErrClosed))
		case <-cctx.Done():
		}
	}()
	return cctx, func() { cancel(nil) }
}

// Close stops campaigning and releases the leader lock if this replica
// holds it, so another replica can take over at once. It waits for the
// campaign to end (a campaign blocked in a waiting Acquire ends when its
// context is cancelled) and is idempotent.
func (e *Elector) Close() error {
	e.cancel()
	<-e.done
	e.mu.Lock()
	defer e.mu.Unlock()
	e.closed = true
	if e.err != nil {
		return e.err
	}
	return e.closeErr
}
