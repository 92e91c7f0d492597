package flock

import (
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Waiting. flock(2) has no way to wait with a deadline: a blocking
// LOCK_EX cannot be abandoned when the caller's context ends without
// leaving a thread, a descriptor and, once it gets through, a lock behind.
// So waiters retry non-blocking attempts, woken by
//   - releases in this process, which call wake directly;
//   - close and delete events of the name's lock files, from one inotify
//     watch per directory and process (Linux), which is how a release or
//     the death of a holder in another process shows;
//   - a poll timer, backing off from minPoll to maxPoll, for what no event
//     reports (other systems, network file systems, a lost event).
//
// A waiter keeps its descriptors open between attempts, so its retries
// make no close events of their own that would wake the other waiters.

const (
	minPoll          = time.Millisecond
	maxPoll          = 50 * time.Millisecond
	maxPollInotified = 250 * time.Millisecond
)

// waitKey names the wait queue of one lock name in one directory.
func waitKey(dir, esc string) string { return dir + "\x00" + esc }

type waitq struct {
	n  int           // subscribers
	ch chan struct{} // closed and replaced on every wake
}

var waits = struct {
	sync.Mutex
	m map[string]*waitq
	n atomic.Int64 // subscribers in all queues, so a release with none skips the lock
}{m: map[string]*waitq{}}

func subscribe(key string) *waitq {
	waits.Lock()
	defer waits.Unlock()
	q := waits.m[key]
	if q == nil {
		q = &waitq{ch: make(chan struct{})}
		waits.m[key] = q
	}
	q.n++
	waits.n.Add(1)
	return q
}

func unsubscribe(key string, q *waitq) {
	waits.Lock()
	defer waits.Unlock()
	waits.n.Add(-1)
	if q.n--; q.n == 0 {
		delete(waits.m, key)
	}
}

// signal returns the channel the next wake closes. A waiter takes it
// before each attempt, so a release between the attempt and the wait is
// not missed.
func (q *waitq) signal() <-chan struct{} {
	waits.Lock()
	defer waits.Unlock()
	return q.ch
}

// wakeName wakes the waiters of a name in this process.
func wakeName(dir, esc string) {
	if waits.n.Load() > 0 {
		wake(waitKey(dir, esc))
	}
}

func wake(key string) {
	waits.Lock()
	if q := waits.m[key]; q != nil {
		close(q.ch)
		q.ch = make(chan struct{})
	}
	waits.Unlock()
}

// lockFileEsc returns the escaped name a lock or slot file in the
// directory belongs to: "<esc>.lock" or "<esc>.<i>.lock".
func lockFileEsc(file string) (string, bool) {
	esc, rest, ok := strings.Cut(file, ".")
	if !ok || esc == "" {
		return "", false
	}
	if rest == "lock" {
		return esc, true
	}
	num, ok := strings.CutSuffix(rest, ".lock")
	if !ok || !isDigits(num) {
		return "", false
	}
	return esc, true
}

func isDigits(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}
