package backend

import (
	"context"
	"errors"
	"time"

	"github.com/ubgo/lock"
)

// A Subscription is how one waiting Acquire learns that another attempt
// may succeed: a release in this process, a notification from the server
// or from the kernel.
type Subscription interface {
	// Wake returns the channel the next wake-up closes or sends on. Wait
	// takes it before every attempt, so that a release during the attempt
	// is not missed.
	Wake() <-chan struct{}
	// Close ends the subscription.
	Close()
}

// Waiting describes how one Acquire waits.
type Waiting struct {
	Wait   bool            // WithWait: without it the first contention is returned
	Locked error           // the backend's ErrLocked, which an attempt returns on contention
	Closed <-chan struct{} // closed when the factory closes: the wait ends with lock.ErrClosed

	// MinPoll and MaxPoll bound the interval between attempts when no
	// wake-up comes: it starts at MinPoll, doubles up to MaxPoll, and falls
	// back to MinPoll after every wake-up. Polling covers what no wake-up
	// reports (a holder that died, a lost notification).
	MinPoll, MaxPoll time.Duration

	// Subscribe starts listening for releases of the name, at the first
	// contention. Wait then tries again at once: a release between the
	// attempt and the subscription sent no wake-up.
	Subscribe func() (Subscription, error)

	// Queued subscribes before the first attempt and makes that attempt
	// only when woken (or polled): others in this process wait already,
	// and a newcomer queues behind them instead of overtaking them.
	Queued bool

	// Early subscribes before the first attempt, which is made at once:
	// the subscription covers it (a store that hands the name to a
	// waiter must know the waiter before it asks), so there is no second
	// attempt after the first contention. The wait still counts from the
	// first contention.
	Early bool
}

// Wait makes attempts until one gets the lock, fails other than with
// contention, or (with w.Wait) ctx ends or the factory closes. An attempt
// returns the holder, or on contention w.Locked and, when it knows, how
// long until the lock may be free (0 when it does not), which caps the
// next poll. Wait returns the holder or the error, and the time spent
// waiting after the first contention.
//
// With w.Wait, a wait that ends with ctx while the last completed attempt
// found the name held, and was sent within Fresh, returns a
// lock.WaitError on w.Locked; before a deadline Wait makes such an
// attempt if the last one is older (however long the poll); an attempt
// that fails other than by ctx's ending ends the wait with that failure
// (said as a wait that gave up if ctx has ended), which never matches
// lock.ErrLocked. When ctx ends before any attempt told lately, Wait
// returns ctx's error and Take decides (see Call.Probe).
func Wait[H any](ctx context.Context, w Waiting, attempt func() (H, time.Duration, error)) (H, time.Duration, error) {
	r := &waitRun{ctx: ctx, w: w, poll: w.MinPoll, ev: evidenceOf(ctx)}
	defer r.close()
	var zero H
	skip := false
	if w.Wait && (w.Queued || w.Early) {
		if err := r.subscribe(); err != nil {
			return zero, r.waited(), r.failed(err)
		}
		skip = w.Queued
	}
	for {
		var wake <-chan struct{}
		var hint time.Duration
		if r.sub != nil {
			wake = r.sub.Wake()
		}
		if !skip {
			at := time.Now()
			h, retry, err := attempt()
			r.ev.answered(at, err)
			switch {
			case err == nil:
				return h, r.waited(), nil
			case !errors.Is(err, w.Locked):
				return zero, r.waited(), r.failed(err)
			case !w.Wait:
				return zero, 0, err
			}
			r.held, r.sent = true, at
			if r.start.IsZero() {
				r.start = at // an Early wait begins at its first contention
			}
			if r.sub == nil {
				if err := r.subscribe(); err != nil {
					return zero, r.waited(), r.failed(err)
				}
				continue
			}
			hint = retry
		}
		skip = false
		if err := r.sleep(wake, hint); err != nil {
			return zero, r.waited(), err
		}
	}
}

// waitRun is the state of one Wait, on its goroutine only.
type waitRun struct {
	ctx   context.Context
	w     Waiting
	ev    *evidence
	sub   Subscription
	start time.Time // when the wait began: the subscription, or an Early one's first contention
	timer *time.Timer
	poll  time.Duration
	held  bool      // an attempt found the name held (any other outcome ends the wait)
	sent  time.Time // when the last attempt that found it held was sent
}

func (r *waitRun) subscribe() error {
	s, err := r.w.Subscribe()
	if err == nil {
		r.sub, r.timer = s, time.NewTimer(time.Hour)
		if !r.w.Early {
			r.start = time.Now()
		}
	}
	return err
}

func (r *waitRun) close() {
	if r.sub != nil {
		r.sub.Close()
		r.timer.Stop()
	}
}

func (r *waitRun) waited() time.Duration {
	if r.start.IsZero() {
		return 0
	}
	return time.Since(r.start)
}

// failed is the error that ends the wait: err, the failure of an attempt
// or of a subscription, or (nil) ctx's ending.
func (r *waitRun) failed(err error) error {
	ctx := r.ctx
	switch {
	case !r.w.Wait || ctx.Err() == nil:
	case r.held && (err == nil || endedBy(ctx, err)) && time.Since(r.sent) <= Fresh:
		err = lock.NewWaitError(r.w.Locked, ctx)
	case err == nil || endedBy(ctx, err):
		err = ctx.Err() // nothing told lately: the probe decides (see Take)
	default:
		err = failure(ctx, err)
	}
	return err
}

// sleep waits for a wake-up, the next poll (capped by the attempt's hint),
// ctx's end or the factory's closing; it returns the error that ends the
// wait, if one does.
func (r *waitRun) sleep(wake <-chan struct{}, hint time.Duration) error {
	d := r.poll
	if hint > 0 {
		d = min(d, hint)
	}
	if end, ok := r.ctx.Deadline(); ok && r.sent.Before(end.Add(-Fresh)) {
		// A last look within Fresh of the deadline, so that a wait that
		// runs out can say whether the name was still held.
		d = min(d, time.Until(end.Add(-Fresh/2)))
	}
	r.timer.Reset(max(d, time.Millisecond))
	select {
	case <-wake:
		r.poll = r.w.MinPoll
	case <-r.timer.C:
		r.poll = min(2*r.poll, r.w.MaxPoll)
	case <-r.ctx.Done():
		return r.failed(nil)
	case <-r.w.Closed:
		return lock.ErrClosed
	}
	return nil
}
