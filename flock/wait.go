package flock

import (
	"sync/atomic"
	"time"

	"github.com/ubgo/lock/internal/dirwatch"
)

// Waiting. flock(2) has no way to wait with a deadline: a blocking
// LOCK_EX cannot be abandoned when the caller's context ends without
// leaving a thread, a descriptor and, once it gets through, a lock behind.
// So a waiter retries non-blocking attempts (backend.Wait), woken through
// internal/dirwatch by
//   - releases in this process, which signal the name;
//   - close and delete events of the name's lock files, from one inotify
//     watch per directory and process (Linux), which is how a release or
//     the death of a holder in another process shows;
//   - a poll, backing off from minPoll to maxPoll (blindPoll without
//     inotify), for what no event reports.
//
// A waiter keeps its descriptors open between attempts, so its retries
// make no close events of their own that would wake the other waiters.

const (
	minPoll   = time.Millisecond
	maxPoll   = 250 * time.Millisecond // inotify watches: polls only cover lost events
	blindPoll = 50 * time.Millisecond  // no inotify: polls are how other processes' releases show
)

// waiting counts the Acquires of this process that wait, for tests.
var waiting atomic.Int64

// subscription is a dirwatch subscription that counts itself in waiting.
type subscription struct{ *dirwatch.Subscription }

func subscribe(dir, esc string) subscription {
	s := subscription{dirwatch.Subscribe(dir, esc)}
	waiting.Add(1)
	return s
}

func (s subscription) Close() {
	waiting.Add(-1)
	s.Subscription.Close()
}
