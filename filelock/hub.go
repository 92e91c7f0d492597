//go:build unix

package filelock

import (
	"sync"
	"time"
)

// watchLinger is how long a directory watcher outlives its last waiter.
// Closing an inotify instance waits for an RCU grace period (tens of
// milliseconds), so it is done later and off the waiter's path, and a wait
// that follows soon reuses the watcher.
const watchLinger = time.Second

// A hub wakes the waiters of one directory: directly when a holder in this
// process frees a marker, and through the directory watcher when another
// process does. There is one hub per directory per process, shared by every
// factory, so that factories of one process wake each other too.
type hub struct {
	dir string

	mu    sync.Mutex
	names map[string]*waitList // by escaped name
	subs  int
	w     watcher
	gen   int // bumped whenever subs leaves 0, so a stale retire does nothing
}

type waitList struct {
	ch   chan struct{} // closed and replaced at every wake-up
	subs int
}

var hubs = struct {
	sync.Mutex
	m map[string]*hub
}{m: map[string]*hub{}}

func hubFor(dir string) *hub {
	hubs.Lock()
	defer hubs.Unlock()
	h := hubs.m[dir]
	if h == nil {
		h = &hub{dir: dir, names: map[string]*waitList{}}
		hubs.m[dir] = h
	}
	return h
}

// signal wakes the waiters of esc.
func (h *hub) signal(esc string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if l := h.names[esc]; l != nil {
		close(l.ch)
		l.ch = make(chan struct{})
	}
}

// signalAll wakes every waiter, when the watcher may have missed events.
func (h *hub) signalAll() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, l := range h.names {
		close(l.ch)
		l.ch = make(chan struct{})
	}
}

// A subscription is one waiting Acquire. Call wake before each attempt and
// wait on the channel it returns, so that a release between the attempt and
// the wait is not missed.
type subscription struct {
	h   *hub
	esc string
	l   *waitList
}

// subscribe registers a waiter for esc and starts watching the directory
// when it is the first waiter. watching reports whether events from other
// processes will arrive (else the caller must poll more often).
func (h *hub) subscribe(esc string) (s *subscription, watching bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	l := h.names[esc]
	if l == nil {
		l = &waitList{ch: make(chan struct{})}
		h.names[esc] = l
	}
	l.subs++
	h.subs++
	if h.subs == 1 {
		h.gen++
		if h.w == nil {
			h.w = startWatcher(h.dir, h.signal, h.signalAll)
		}
	}
	return &subscription{h: h, esc: esc, l: l}, h.w != nil
}

func (s *subscription) wake() <-chan struct{} {
	s.h.mu.Lock()
	defer s.h.mu.Unlock()
	return s.l.ch
}

func (s *subscription) close() {
	h := s.h
	h.mu.Lock()
	s.l.subs--
	if s.l.subs == 0 {
		delete(h.names, s.esc)
	}
	h.subs--
	if h.subs == 0 && h.w != nil {
		gen := h.gen
		time.AfterFunc(watchLinger, func() { h.retire(gen) })
	}
	h.mu.Unlock()
}

// retire stops the watcher if no waiter came since generation gen left.
func (h *hub) retire(gen int) {
	h.mu.Lock()
	var w watcher
	if h.subs == 0 && h.gen == gen {
		w, h.w = h.w, nil
	}
	h.mu.Unlock()
	if w != nil {
		w.stop() // outside h.mu: the watcher's goroutine takes it to signal
	}
}
