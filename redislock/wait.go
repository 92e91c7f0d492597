package redislock

import (
	"context"
	"errors"
	"net"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Waiting. A waiter that finds the name taken puts its id in the name's
// queue in Redis, in the same acquire script (lua/queue.lua): a sorted set
// in FIFO order, beside a hash of each waiter's deadline and its factory's
// channel. A free name goes only to the first live waiter in the queue
// (others, newcomers included, queue behind it), and the script that frees
// the name (a release, a waiter giving up) publishes that waiter's id on
// its factory's channel, so one release wakes one waiter of one process.
//
// Each factory has one channel and one pub/sub connection, subscribed
// while it has waiters (and lingerTime after), whatever names they wait
// for. A waiter is the backend.Subscription of one waiting Acquire; it is
// in the hub before its first attempt, so that a wake for its id is not
// missed. When the server confirms the subscription, and again after a
// reconnect (which covers a wake published while the connection was
// down), every queued waiter of the factory looks once more.
//
// Failures: a waiter that gives up (ctx, Close) leaves the queue by the
// release script, which tells the next waiter if the name is free. A
// waiter's place lasts queueLife past its last attempt (a waiter makes one
// at least every maxPoll): the place of a process that died is dropped
// then, and earlier on one server, where the wake's PUBLISH reaching no
// subscriber drops it and tells the next. A wake that is lost anyway is
// covered by the waiter's next attempt, at most maxPoll later.
type hub struct {
	f  *Factory
	ch string // this factory's channel

	subMu sync.Mutex // one SUBSCRIBE at a time; taken before mu

	mu     sync.Mutex
	ps     *redis.PubSub
	ready  bool               // the server confirmed ps's subscription
	epoch  int                // counts the times ready was lost
	ws     map[string]*waiter // by id (the semaphore form)
	linger *time.Timer
	closed bool
}

// waiter is one waiting Acquire.
type waiter struct {
	h     *hub
	id    string
	queue string        // the name's queue key
	wake  chan struct{} // buffered 1
	leave func()        // takes it out of the server's queue
	epoch int           // h.epoch when it joined

	// Guarded by h.mu.
	queued bool // it met contention, so it may be in the server's queue
	// acquired: the wait ended with the lock, set by the attempt that got
	// it (on the waiting goroutine, before Close).
	acquired bool
}

// Wake returns the channel its turn, or the server's confirmation of the
// subscription, sends on.
func (w *waiter) Wake() <-chan struct{} { return w.wake }

// Close takes the waiter out of the hub and, if it waited without getting
// the lock, out of the server's queue. It may be called more than once.
func (w *waiter) Close() { w.h.remove(w) }

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

// add puts a waiter for the acquisition id, on the name whose queue key is
// queue, in the hub; leave takes it out of the server's queue. fresh
// reports whether the subscription is up.
func (h *hub) add(id, queue string, leave func()) (w *waiter, fresh bool) {
	w = &waiter{h: h, id: id, queue: queue, wake: make(chan struct{}, 1), leave: leave}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ws == nil {
		h.ws = map[string]*waiter{}
	}
	h.ws[id] = w
	w.epoch = h.epoch
	if h.linger != nil {
		h.linger.Stop()
		h.linger = nil
	}
	return w, h.ready
}

// queued marks w as waiting (the attempt queued it on the server) and
// subscribes if the factory does not listen yet. It reports whether the
// subscription was up, without a break, since before that attempt
// (fresh: up when w was added).
func (h *hub) queued(w *waiter, fresh bool) bool {
	h.mu.Lock()
	w.queued = true
	up := fresh && h.ready && h.epoch == w.epoch
	listening := h.ps != nil || h.closed
	h.mu.Unlock()
	if !listening {
		h.listen()
	}
	return up
}

// waiting reports how many callers wait on the name of this queue key.
func (h *hub) waiting(queue string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, w := range h.ws {
		if w.queue == queue && w.queued {
			n++
		}
	}
	return n
}

// remove takes w out of the hub.
func (h *hub) remove(w *waiter) {
	h.mu.Lock()
	if h.ws[w.id] != w {
		h.mu.Unlock()
		return
	}
	delete(h.ws, w.id)
	if len(h.ws) == 0 && h.ps != nil && h.linger == nil && !h.closed {
		h.linger = time.AfterFunc(lingerTime, h.idle)
	}
	gaveUp := w.queued && !w.acquired
	h.mu.Unlock()
	if gaveUp {
		w.leave()
	}
}

// listen subscribes to the factory's channel, unless it is already.
func (h *hub) listen() {
	h.subMu.Lock()
	defer h.subMu.Unlock()
	h.mu.Lock()
	need := h.ps == nil && !h.closed && len(h.ws) > 0
	h.mu.Unlock()
	if !need {
		return
	}
	// go-redis sends SUBSCRIBE without waiting for the reply (read's
	// confirmation wakes the waiters); on a failure it subscribes again
	// on the next receive, and the waiters poll meanwhile.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	ps := h.f.c.Subscribe(ctx, h.ch)
	cancel()
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		ps.Close()
		return
	}
	h.ps = ps
	if len(h.ws) == 0 && h.linger == nil {
		h.linger = time.AfterFunc(lingerTime, h.idle)
	}
	h.f.wg.Add(1) // under mu: before close, and so before Close's Wait
	go h.read(ps)
}

// idle closes the connection once nobody has waited for lingerTime.
func (h *hub) idle() {
	h.mu.Lock()
	h.linger = nil
	ps := h.ps
	if len(h.ws) > 0 || ps == nil || h.closed {
		h.mu.Unlock()
		return
	}
	h.drop()
	h.mu.Unlock()
	ps.Close()
}

// drop forgets the connection. h.mu is held.
func (h *hub) drop() {
	h.ps = nil
	h.unready()
}

// unready records that the subscription may have missed a wake. h.mu is
// held.
func (h *hub) unready() {
	if h.ready {
		h.ready = false
		h.epoch++
	}
}

// replace swaps a connection that stopped answering for a new one.
func (h *hub) replace(old *redis.PubSub) {
	h.mu.Lock()
	if h.ps != old || h.closed {
		h.mu.Unlock()
		return
	}
	h.drop()
	h.mu.Unlock()
	old.Close()
	h.listen()
}

func (h *hub) current(ps *redis.PubSub) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.ps == ps && !h.closed
}

// read delivers the wakes of ps until ps is closed or replaced.
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
				// subscribes again on the next receive; the confirmation
				// then wakes every waiter.
				h.mu.Lock()
				h.unready()
				h.mu.Unlock()
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
			h.notify(m.Payload)
		case *redis.Subscription:
			if m.Kind == "subscribe" {
				h.confirmed()
			}
		}
	}
}

// notify wakes the waiter whose turn it is.
func (h *hub) notify(id string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if w := h.ws[id]; w != nil {
		signal(w)
	}
}

// confirmed wakes every queued waiter: a wake may have been published
// before the subscription took effect.
func (h *hub) confirmed() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ready = true
	for _, w := range h.ws {
		if w.queued {
			signal(w)
		}
	}
}

// close stops the hub for good.
func (h *hub) close() {
	h.mu.Lock()
	h.closed = true
	ps := h.ps
	h.drop()
	if h.linger != nil {
		h.linger.Stop()
		h.linger = nil
	}
	h.mu.Unlock()
	if ps != nil {
		ps.Close()
	}
}
