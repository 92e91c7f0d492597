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
	var (
		zero  H
		sub   Subscription
		start time.Time
		timer *time.Timer
		poll  = w.MinPoll
		skip  bool
		held  bool      // an attempt found the name held (any other outcome ends the wait)
		sent  time.Time // when the last attempt that found it held was sent
		ev    = evidenceOf(ctx)
	)
	waited := func() time.Duration {
		if sub == nil {
			return 0
		}
		return time.Since(start)
	}
	defer func() {
		if sub != nil {
			sub.Close()
			timer.Stop()
		}
	}()
	// failed ends the wait with err, the failure of an attempt or of a
	// subscription, or ctx's ending.
	failed := func(err error) (H, time.Duration, error) {
		switch {
		case !w.Wait || ctx.Err() == nil:
		case held && (err == nil || endedBy(ctx, err)) && time.Since(sent) <= Fresh:
			err = lock.NewWaitError(w.Locked, ctx)
		case err == nil || endedBy(ctx, err):
			err = ctx.Err() // nothing told lately: the probe decides (see Take)
		default:
			err = failure(ctx, err)
		}
		return zero, waited(), err
	}
	subscribe := func() error {
		s, err := w.Subscribe()
		if err == nil {
			sub, start, timer = s, time.Now(), time.NewTimer(time.Hour)
		}
		return err
	}
	if w.Wait && w.Queued {
		if err := subscribe(); err != nil {
			return failed(err)
		}
		skip = true
	}
	for {
		var wake <-chan struct{}
		var hint time.Duration
		if sub != nil {
			wake = sub.Wake()
		}
		if !skip {
			at := time.Now()
			h, retry, err := attempt()
			ev.answered(at, err)
			switch {
			case err == nil:
				return h, waited(), nil
			case !errors.Is(err, w.Locked):
				return failed(err)
			case !w.Wait:
				return zero, 0, err
			}
			held, sent = true, at
			if sub == nil {
				if err := subscribe(); err != nil {
					return failed(err)
				}
				continue
			}
			hint = retry
		}
		skip = false
		d := poll
		if hint > 0 {
			d = min(d, hint)
		}
		if end, ok := ctx.Deadline(); ok && sent.Before(end.Add(-Fresh)) {
			// A last look within Fresh of the deadline, so that a wait
			// that runs out can say whether the name was still held.
			d = min(d, time.Until(end.Add(-Fresh/2)))
		}
		timer.Reset(max(d, time.Millisecond))
		select {
		case <-wake:
			poll = w.MinPoll
		case <-timer.C:
			poll = min(2*poll, w.MaxPoll)
		case <-ctx.Done():
			return failed(nil)
		case <-w.Closed:
			return zero, waited(), lock.ErrClosed
		}
	}
}
