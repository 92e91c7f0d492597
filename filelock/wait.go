//go:build unix

package filelock

import (
	"context"
	"time"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/backend"
	"github.com/ubgo/lock/internal/dirwatch"
)

// Polling of waiters, for locks freed without a file event (crash, expiry,
// another host): it starts fast and backs off to the cap. The cap is lower
// when no directory watch delivers releases by other processes.
const (
	minPoll        = 2 * time.Millisecond
	maxPollWatched = 250 * time.Millisecond
	maxPollBlind   = 50 * time.Millisecond
)

// wait makes attempts on esc in dir until one takes the lock, or, with
// WithWait, until ctx ends or the factory closes. attempt returns, on
// contention, when the earliest live marker's lease ends (zero if unknown).
// Waiters are woken by releases and sweeps in this process and by the
// directory's watch (dirwatch).
func (f *Factory) wait(ctx context.Context, o *lock.Options, dir, esc string, attempt func() (*Holder, time.Time, error)) (*Holder, time.Duration, error) {
	var sub *dirwatch.Subscription
	w := backend.Waiting{
		Wait: o.Wait, Locked: ErrLocked, Closed: f.closing.Done(),
		MinPoll: minPoll, MaxPoll: maxPollWatched,
		Subscribe: func() (backend.Subscription, error) {
			sub = dirwatch.Subscribe(dir, esc)
			return sub, nil
		},
	}
	return backend.Wait(ctx, w, func() (*Holder, time.Duration, error) {
		h, retryAt, err := attempt()
		return h, retryHint(retryAt, sub), err
	})
}

// retryHint caps the next poll: at a moment after the earliest live
// marker's lease ends, and at maxPollBlind when no watch reports releases
// by other processes.
func retryHint(retryAt time.Time, sub *dirwatch.Subscription) time.Duration {
	var d time.Duration
	if !retryAt.IsZero() {
		d = max(time.Until(retryAt)+time.Millisecond, minPoll)
	}
	if sub != nil && !sub.Watched() && (d == 0 || d > maxPollBlind) {
		d = maxPollBlind
	}
	return d
}
