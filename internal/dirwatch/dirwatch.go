// Package dirwatch wakes the waiters of lock files in a directory: directly
// when a holder in this process frees a name (Signal), and through one
// inotify watch per directory (Linux) when another process does. flock and
// filelock share it, and with it one hub per directory per process, so
// that factories of one process wake each other too.
//
// A lock file of the escaped name esc is "<esc>.lock" or "<esc>.<n>.lock";
// an escaped name contains no '.'. Closing such a file after writing,
// deleting it or renaming it away wakes the name's waiters. A wake-up is a
// hint: the waiter tries again and may find the name still held.
package dirwatch

import (
	"slices"
	"sync"
	"time"
)

// linger is how long a directory's watch outlives its last waiter.
// Closing an inotify instance waits for a kernel grace period (tens of
// milliseconds), so it is done later and off the waiter's path, and a wait
// that follows soon reuses the watch.
const linger = time.Second

// A hub holds the waiters of one directory.
type hub struct {
	dir   string
	names map[string]*list // by escaped name
	subs  int
	w     *watch // nil while nobody waits, or when inotify is unavailable
	gen   int    // bumped whenever subs leaves 0, so a stale retire does nothing
}

type list struct {
	ch   chan struct{}   // closed and replaced at every wake-up
	subs []*Subscription // in the order they subscribed
}

// mu guards every hub; wake-ups are rare next to the work of an attempt.
var (
	mu   sync.Mutex
	hubs = map[string]*hub{}
	// watching counts each directory's watches from their start to the
	// end of their stop, which may follow the hub's retirement.
	watching = map[string]int{}
)

// A Subscription is one waiting Acquire. Take Wake before each attempt and
// wait on the channel it returns, so that a release between the attempt and
// the wait is not missed.
type Subscription struct {
	h       *hub
	esc     string
	l       *list
	watched bool
}

// Subscribe registers a waiter for esc in dir (an absolute path) and
// starts watching dir when it is the first waiter there.
func Subscribe(dir, esc string) *Subscription {
	mu.Lock()
	defer mu.Unlock()
	h := hubs[dir]
	if h == nil {
		h = &hub{dir: dir, names: map[string]*list{}}
		hubs[dir] = h
	}
	l := h.names[esc]
	if l == nil {
		l = &list{ch: make(chan struct{})}
		h.names[esc] = l
	}
	if h.subs++; h.subs == 1 {
		h.gen++
		if h.w == nil {
			if h.w = start(dir); h.w != nil {
				watching[dir]++
			}
		}
	}
	s := &Subscription{h: h, esc: esc, l: l, watched: h.w != nil}
	l.subs = append(l.subs, s)
	return s
}

// Subscribers is how many waiters of this process are subscribed for esc
// in dir, so that tests can act once a waiter waits.
func Subscribers(dir, esc string) int {
	mu.Lock()
	defer mu.Unlock()
	if h := hubs[dir]; h != nil && h.names[esc] != nil {
		return len(h.names[esc].subs)
	}
	return 0
}

// First reports whether s is the oldest subscription of its name in this
// process: the waiter whose turn it is, for a backend that lets the
// waiters of one process take a name in the order they came (and wakes
// them, Signal, when the first one leaves).
func (s *Subscription) First() bool {
	mu.Lock()
	defer mu.Unlock()
	return len(s.l.subs) > 0 && s.l.subs[0] == s
}

// Watched reports whether releases in other processes wake the waiter;
// when they do not, the caller must poll more often.
func (s *Subscription) Watched() bool { return s.watched }

// Wake returns the channel the next wake-up of the name closes.
func (s *Subscription) Wake() <-chan struct{} {
	mu.Lock()
	defer mu.Unlock()
	return s.l.ch
}

// Close ends the subscription.
func (s *Subscription) Close() { s.Leave() }

// Leave ends the subscription, as Close, and reports whether it was
// First.
func (s *Subscription) Leave() (first bool) {
	mu.Lock()
	defer mu.Unlock()
	h, l := s.h, s.l
	i := slices.Index(l.subs, s)
	if i < 0 {
		return false // closed already
	}
	l.subs = slices.Delete(l.subs, i, i+1)
	if len(l.subs) == 0 {
		delete(h.names, s.esc)
	}
	if h.subs--; h.subs == 0 && h.w != nil {
		gen := h.gen
		time.AfterFunc(linger, func() { h.retire(gen) })
	}
	return i == 0
}

// retire stops the watch if no waiter came since generation gen left.
func (h *hub) retire(gen int) {
	mu.Lock()
	var w *watch
	if h.subs == 0 && h.gen == gen {
		w, h.w = h.w, nil
		delete(hubs, h.dir)
	}
	mu.Unlock()
	if w != nil {
		w.stop() // outside mu: the watch's goroutine takes it to wake
		mu.Lock()
		if watching[h.dir]--; watching[h.dir] == 0 {
			delete(watching, h.dir)
		}
		mu.Unlock()
	}
}

// Watching reports whether this process watches dir, or is still closing
// its watch (its inotify descriptor is open), so that tests can wait for
// the watch of a directory nobody waits on to retire.
func Watching(dir string) bool {
	mu.Lock()
	defer mu.Unlock()
	return watching[dir] > 0
}

// Signal wakes the waiters of esc in dir in this process.
func Signal(dir, esc string) {
	mu.Lock()
	defer mu.Unlock()
	if h := hubs[dir]; h != nil {
		h.wake(esc)
	}
}

// wake wakes the waiters of esc, or every waiter of the directory when esc
// is "" (the watch may have lost events). mu is held.
func (h *hub) wake(esc string) {
	for name, l := range h.names {
		if esc == "" || name == esc {
			close(l.ch)
			l.ch = make(chan struct{})
		}
	}
}
