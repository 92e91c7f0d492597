package flock

import (
	"time"

	"github.com/ubgo/lock/backend"
	"github.com/ubgo/lock/internal/dirwatch"
)

// Waiting, one model: non-blocking attempts in backend.Wait, woken through
// internal/dirwatch, else a poll; the waiters of one process in the order
// they came. flock(2) has no way to wait with a deadline: a blocking
// LOCK_EX cannot be abandoned when the caller's context ends without
// leaving a thread, a descriptor and, once it gets through, a lock behind.
// So a waiter retries, woken by
//   - releases in this process, which signal the name;
//   - close and delete events of the name's lock files, from one inotify
//     watch per directory and process (Linux), which is how a release or
//     the death of a holder in another process shows;
//   - a poll, backing off from minPoll to maxPollWatched (maxPollBlind
//     without inotify), for what no event reports.
//
// Within a process, only the longest-waiting waiter of a name tries the
// kernel's lock (dirwatch's First); the others wait for its turn to end.
// An Acquire that finds others of its process waiting queues behind them
// (backend.Waiting.Queued) instead of trying at once. A holder that
// releases and asks again therefore cannot take the name back from the
// waiters of its own process, which a release merely wakes: the kernel
// would let the releaser, still running, win nearly every time. Across
// processes waiters race, as blocked flock(2) callers do.
//
// A waiter keeps its descriptors open between attempts, so its retries
// make no close events of their own that would wake the other waiters.
// Not waits for a lock: files held for a few system calls (a name's
// guard, the fence, a sweep's hold on a name) are polled by lockSpin.

const (
	minPoll        = time.Millisecond
	maxPollWatched = 250 * time.Millisecond // inotify watches: polls only cover lost events
	maxPollBlind   = 50 * time.Millisecond  // no inotify: polls are how other processes' releases show
)

// waiter is one Acquire's backend.Subscription: dirwatch's wake-ups of
// its name, from its first contention on.
type waiter struct {
	dir, esc string
	*dirwatch.Subscription
}

// waiting describes the wait to backend.Wait; w is nil for a call that
// does not wait.
func (w *waiter) waiting(closed <-chan struct{}) backend.Waiting {
	if w == nil {
		return backend.Waiting{Locked: ErrLocked}
	}
	return backend.Waiting{
		Wait: true, Locked: ErrLocked, Closed: closed,
		MinPoll: minPoll, MaxPoll: maxPollWatched, Subscribe: w.subscribe,
		Queued: dirwatch.Subscribers(w.dir, w.esc) > 0,
	}
}

func (w *waiter) subscribe() (backend.Subscription, error) {
	w.Subscription = dirwatch.Subscribe(w.dir, w.esc)
	return w, nil
}

// Close ends the waiter's subscription. If it was the first of its
// process, the others are woken: the next one's turn has come.
func (w *waiter) Close() {
	if w.Leave() {
		dirwatch.Signal(w.dir, w.esc)
	}
}

// turn reports whether the waiter may try the kernel's lock: it is the
// first of its process for the name, or has not subscribed yet.
func (w *waiter) turn() bool {
	return w == nil || w.Subscription == nil || w.First()
}

// hint caps the next poll at maxPollBlind when no inotify watch reports
// other processes' releases.
func (w *waiter) hint() time.Duration {
	if w != nil && w.Subscription != nil && !w.Watched() {
		return maxPollBlind
	}
	return 0
}
