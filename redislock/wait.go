package redislock

import (
	"context"
	"errors"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Waiting. The release script publishes on the name's channel. A factory
// keeps one pub/sub connection, subscribed to the channels of the names its
// callers wait for, and wakes the first of its waiters of a name per
// release (FIFO within the process). A waiter is the backend.Subscription
// of one waiting Acquire: backend.Wait joins it at the first contention and
// then looks again at once, so a release in between is not missed. A new
// subscription wakes the first waiter of its channel once the server
// confirms it (go-redis sends SUBSCRIBE without waiting for the reply, so
// the look may have come first), and so does the re-subscription after a
// reconnect, which covers releases published while the connection was
// down. The first waiter is enough: the ones behind it get their turn when
// it takes the lock and releases it, takes a permit (another may be free)
// or gives up. Waking them all would let one behind overtake it.
type hub struct {
	f *Factory

	subMu  sync.Mutex      // orders SUBSCRIBE and UNSUBSCRIBE; taken before mu
	subbed map[string]bool // channels subscribed on ps; guarded by subMu

	mu     sync.Mutex
	ps     *redis.PubSub
	chans  map[string][]*waiter // waiters per channel, FIFO
	linger *time.Timer
	closed bool
}

// waiter is one waiting Acquire's place in the queue of its channel.
type waiter struct {
	h     *hub
	ch    string
	wake  chan struct{} // buffered 1
	limit int
	// acquired: the wait ended with the lock, set by the attempt that got
	// it (on the waiting goroutine, before Close).
	acquired bool
}

// Wake returns the channel a release of the name, or the server's
// confirmation of the subscription, sends on.
func (w *waiter) Wake() <-chan struct{} { return w.wake }

// Close takes the waiter out of the queue.
func (w *waiter) Close() { w.h.leave(w) }

const (
	// lingerTime keeps an idle pub/sub connection open a little, for the
	// next waiter.
	lingerTime = 2 * time.Second
	// pubsubIdle is how long the connection may stay silent before it is
	// pinged, and replaced if the ping is not answered within as long.
	pubsubIdle = 15 * time.Second
)

func signal(w *waiter) {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// join queues a waiter on ch, for a name of this semaphore limit, and
// subscribes to ch if this process did not listen on it yet. ahead is the
// number of waiters queued before it.
func (h *hub) join(ch string, limit int) (w *waiter, ahead int) {
	w = &waiter{h: h, ch: ch, wake: make(chan struct{}, 1), limit: limit}
	h.mu.Lock()
	if h.chans == nil {
		h.chans = map[string][]*waiter{}
	}
	ws, listening := h.chans[ch]
	h.chans[ch] = append(ws, w)
	closed := h.closed
	h.mu.Unlock()
	if !listening && !closed {
		h.sync()
	}
	return w, len(ws)
}

// waiting reports how many callers wait on ch.
func (h *hub) waiting(ch string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.chans[ch])
}

// leave takes w out of the queue. A wake w did not use (it gave up, or
// got the lock through an earlier wake) passes to the next waiter, and so
// does the turn after a semaphore permit was taken: another permit may be
// free.
func (h *hub) leave(w *waiter) {
	h.mu.Lock()
	ws := h.chans[w.ch]
	if i := slices.Index(ws, w); i >= 0 {
		ws = slices.Delete(ws, i, i+1)
	}
	pending := false
	select {
	case <-w.wake:
		pending = true
	default:
	}
	if len(ws) > 0 {
		h.chans[w.ch] = ws
		if pending || !w.acquired || w.limit > 1 {
			signal(ws[0])
		}
		h.mu.Unlock()
		return
	}
	delete(h.chans, w.ch)
	if h.closed {
		h.mu.Unlock()
		return
	}
	// Unsubscribe in the background: the caller need not wait for it,
	// which could take a dial timeout while Redis is away.
	h.f.wg.Add(1)
	h.mu.Unlock()
	go func() {
		defer h.f.wg.Done()
		h.sync()
	}()
}

// sync brings the subscriptions in line with the channels waited on.
func (h *hub) sync() {
	h.subMu.Lock()
	defer h.subMu.Unlock()
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return
	}
	var add, drop []string
	for ch := range h.chans {
		if !h.subbed[ch] {
			add = append(add, ch)
		}
	}
	for ch := range h.subbed {
		if _, ok := h.chans[ch]; !ok {
			drop = append(drop, ch)
		}
	}
	ps := h.ps
	h.mu.Unlock()

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if h.subbed == nil {
		h.subbed = map[string]bool{}
	}
	if len(drop) > 0 && ps != nil {
		ps.Unsubscribe(ctx, drop...)
	}
	for _, ch := range drop {
		delete(h.subbed, ch)
	}
	if len(add) > 0 {
		if ps == nil {
			ps = h.f.c.Subscribe(ctx, add...)
			h.start(ps)
		} else {
			// On error go-redis keeps the channel and subscribes on
			// reconnect; the waiter polls meanwhile.
			ps.Subscribe(ctx, add...)
		}
		for _, ch := range add {
			h.subbed[ch] = true
		}
	}

	h.mu.Lock()
	switch {
	case len(h.chans) > 0 && h.linger != nil:
		h.linger.Stop()
		h.linger = nil
	case len(h.chans) == 0 && h.ps != nil && h.linger == nil:
		h.linger = time.AfterFunc(lingerTime, h.idle)
	}
	h.mu.Unlock()
}

// start makes ps the hub's connection and starts its reader. subMu is held.
func (h *hub) start(ps *redis.PubSub) {
	h.mu.Lock()
	h.ps = ps
	h.mu.Unlock()
	h.f.wg.Add(1)
	go h.read(ps)
}

// idle closes the connection once nobody has waited for lingerTime.
func (h *hub) idle() {
	h.subMu.Lock()
	defer h.subMu.Unlock()
	h.mu.Lock()
	h.linger = nil
	ps := h.ps
	if len(h.chans) > 0 || ps == nil || h.closed {
		h.mu.Unlock()
		return
	}
	h.ps = nil
	h.mu.Unlock()
	clear(h.subbed)
	ps.Close()
}

// replace swaps a connection that stopped answering for a new one.
func (h *hub) replace(old *redis.PubSub) {
	h.subMu.Lock()
	defer h.subMu.Unlock()
	h.mu.Lock()
	if h.ps != old || h.closed {
		h.mu.Unlock()
		return
	}
	h.ps = nil
	chans := make([]string, 0, len(h.chans))
	for ch := range h.chans {
		chans = append(chans, ch)
	}
	h.mu.Unlock()
	old.Close()
	clear(h.subbed)
	if len(chans) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	h.start(h.f.c.Subscribe(ctx, chans...))
	for _, ch := range chans {
		h.subbed[ch] = true
	}
}

func (h *hub) current(ps *redis.PubSub) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.ps == ps && !h.closed
}

// read delivers the notifications of ps until ps is closed or replaced.
func (h *hub) read(ps *redis.PubSub) {
	defer h.f.wg.Done()
	ctx := context.Background()
	pinged := false
	backoff := 10 * time.Millisecond
	for {
		msg, err := ps.ReceiveTimeout(ctx, pubsubIdle)
		if !h.current(ps) {
			return
		}
		if err != nil {
			var ne net.Error
			switch {
			case errors.Is(err, redis.ErrClosed):
				return
			case errors.As(err, &ne) && ne.Timeout():
				if pinged {
					h.replace(ps)
					return
				}
				pinged = true
				ps.Ping(ctx)
			default:
				// The connection broke. go-redis reconnects and
				// subscribes again on the next receive; the confirmations
				// then wake every waiter.
				t := time.NewTimer(backoff)
				select {
				case <-t.C:
				case <-h.f.closing:
					t.Stop()
					return
				}
				backoff = min(2*backoff, time.Second)
			}
			continue
		}
		pinged, backoff = false, 10*time.Millisecond
		switch m := msg.(type) {
		case *redis.Message:
			h.notify(m.Channel)
		case *redis.Subscription:
			if m.Kind == "subscribe" {
				h.notify(m.Channel)
			}
		}
	}
}

// notify wakes the first waiter of ch.
func (h *hub) notify(ch string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if ws := h.chans[ch]; len(ws) > 0 {
		signal(ws[0])
	}
}

// close stops the hub for good.
func (h *hub) close() {
	h.subMu.Lock()
	h.mu.Lock()
	h.closed = true
	ps := h.ps
	h.ps = nil
	if h.linger != nil {
		h.linger.Stop()
		h.linger = nil
	}
	h.mu.Unlock()
	h.subMu.Unlock()
	if ps != nil {
		ps.Close()
	}
}
