//go:build unix

package filelock

import (
	"time"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/backend"
	"github.com/ubgo/lock/internal/dirwatch"
)

// Waiting, one model: attempts in backend.Wait, woken through
// internal/dirwatch, else a poll. A waiter retries under the name's guard,
// woken by
//   - releases and sweeps in this process, which signal the name;
//   - the removal of a marker by another process on this host, from one
//     inotify watch per directory and process (Linux);
//   - a poll, for markers freed without a file event here (a crash, an
//     expired lease, another host, an intent given up elsewhere): from
//     minPoll doubling to maxPollWatched (maxPollBlind without inotify),
//     and at the moment the earliest live lease ends.
//
// Within a process, only the longest-waiting waiter of a name looks
// (dirwatch's First); the others wait for its turn to end, which it does
// as soon as its marker is published, before the marker's sync.
//
// Not a wait for a lock: a name's guard, held for a few system calls, is
// queued for in this process and polled (guard.go).

const (
	minPoll        = 2 * time.Millisecond
	maxPollWatched = 250 * time.Millisecond // inotify watches: polls cover what no event reports
	maxPollBlind   = 50 * time.Millisecond  // no inotify: polls are how other processes' releases show
)

// waiter is one Acquire's backend.Subscription: dirwatch's wake-ups of
// its name, from its first contention on.
type waiter struct {
	dir, esc string
	*dirwatch.Subscription
}

// waiting describes the wait to backend.Wait. An Acquire that finds
// others of its process waiting queues behind them.
func (w *waiter) waiting(o *lock.Options, closed <-chan struct{}) backend.Waiting {
	return backend.Waiting{
		Wait: o.Wait, Locked: ErrLocked, Closed: closed,
		MinPoll: minPoll, MaxPoll: maxPollWatched, Subscribe: w.subscribe,
		Queued: o.Wait && dirwatch.Subscribers(w.dir, w.esc) > 0,
	}
}

func (w *waiter) subscribe() (backend.Subscription, error) {
	w.Subscription = dirwatch.Subscribe(w.dir, w.esc)
	return w, nil
}

// Close ends the waiter's subscription, once its marker is published or
// it gives up. If it was the first of its process, the others are woken:
// the next one's turn has come.
func (w *waiter) Close() {
	if w.Subscription != nil && w.Leave() {
		dirwatch.Signal(w.dir, w.esc)
	}
}

// turn reports whether the waiter may look at the name: it is the first
// of its process, or has not subscribed yet.
func (w *waiter) turn() bool { return w.Subscription == nil || w.First() }

// hint caps the next poll: at a moment after retryAt, when the earliest
// live marker's lease ends, and at maxPollBlind when no inotify watch
// reports other processes' releases.
func (w *waiter) hint(retryAt time.Time) time.Duration {
	var d time.Duration
	if !retryAt.IsZero() {
		d = max(time.Until(retryAt)+time.Millisecond, minPoll)
	}
	if w.Subscription != nil && !w.Watched() && (d == 0 || d > maxPollBlind) {
		d = maxPollBlind
	}
	return d
}
