package redislock

import (
	"context"
	"errors"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/ubgo/lock/backend"
)

// The waiting model. Every waiting Acquire is a waiter in its factory's
// hub, which is the backend.Subscription that backend.Wait sleeps on:
// each wake-up makes one look (attempt.try), and every look that finds
// the name held says when to look again at the latest (within the lease
// of whoever holds it, or is queued ahead, and maxPoll), so a waiter
// never depends on a wake-up alone. What wakes it depends on what it
// waits for:
//
//   - A mutex waiter joins the name's queue in Redis, a list of its own that
//     the lock's value flags (lua/mutex_acquire.lua), and a release grants the
//     name to the first waiter in the same script: it sets the lock to the
//     waiter's id, with a fresh lease and the next token, and publishes the
//     grant on the waiter's factory channel (hub.own: one per factory, on its
//     one pub/sub connection, while it has waiters and lingerTime after). One
//     release wakes one waiter of one process, and nobody overtakes the queue.
//     The waiter is in the hub before its first look, so no grant is missed,
//     and joins the queue only once the server confirmed the subscription
//     (hub.ready); that confirmation, and the one after a reconnect, make
//     every mutex waiter of the factory look again: one granted the name while
//     the connection was down finds it its own, one skipped (nobody listened)
//     joins again. A grant only wakes the waiter: it takes the name by its
//     next look, which finds its own id in the lock and renews the lease. A
//     grant read late (the process was paused, the message slow) may have run
//     out and the name passed on; only Redis can say, so a grant is never
//     taken as the lock by itself. A grant for an id the factory neither waits
//     for nor holds (a waiter that gave up, a copy of its attempt that queued
//     late) is released at once, to the next waiter.
//   - A semaphore or shared waiter is woken by a release published on the
//     name's channel, which the factory subscribes to while its callers
//     wait for the name; it wakes the first of them (FIFO within the
//     process), which looks again, and the ones behind it get their turn
//     when it takes a permit (another may be free) or gives up. The
//     server's confirmation of the subscription wakes the first waiter
//     too (go-redis sends SUBSCRIBE without waiting for the reply, so the
//     look may have come first).
//
// The guide says why the two kinds wait differently. A waiter's state is
// the hub's, under hub.mu; what one Acquire knows is its attempt's, on
// its waiting goroutine.
type hub struct {
	f   *Factory
	own string // this factory's channel, for the grants to its mutex waiters

	subMu  sync.Mutex      // orders SUBSCRIBE and UNSUBSCRIBE; taken before mu
	subbed map[string]bool // channels subscribed on ps; guarded by subMu

	mu     sync.Mutex
	ps     *redis.PubSub
	ready  bool                 // the server confirmed the subscription to own on ps
	chans  map[string][]*waiter // waiters per channel (own: the mutex waiters), FIFO
	linger *time.Timer
	closed bool
}

// waiter is one waiting Acquire's place in the hub, in the list of the
// channel it is woken on.
type waiter struct {
	h    *hub
	ch   string        // the channel it is woken on: hub.own for a mutex waiter, else the name's
	name string        // the name's channel, which identifies the name
	id   string        // a mutex waiter's id ("<id>:"), which its grant names
	wake chan struct{} // buffered 1

	// Guarded by h.mu.
	queued bool // a look put it in the name's queue in Redis (a mutex waiter)
	done   bool // out of the hub
}

// Wake returns the channel a grant or a release of the name, or the
// server's confirmation of the subscription, sends on.
func (w *waiter) Wake() <-chan struct{} { return w.wake }

// Close takes the waiter out of the hub. It may be called more than once.
func (w *waiter) Close() { w.h.leave(w) }

// waiting is how the attempt waits (see the model above): it subscribes
// before its first look if early, else at its first contention.
func (a *attempt) waiting() backend.Waiting {
	return backend.Waiting{
		Wait: a.o.Wait, Locked: ErrLocked, Closed: a.f.closing,
		// Every look that finds the name held bounds the next (its
		// retry), so a holder or granted waiter that died is noticed
		// within a lease; maxPoll caps it.
		MinPoll: maxPoll, MaxPoll: maxPoll,
		Early:     a.early && !a.ls.permit(),
		Queued:    a.early && a.ls.permit(),
		Subscribe: a.subscribe,
	}
}

// subscribe puts the attempt's waiter in the hub. A permit waiter that
// queued behind others of this process (backend.Waiting.Queued) finds
// them gone if none is ahead: its turn, it looks at once.
func (a *attempt) subscribe() (backend.Subscription, error) {
	ch, id := a.k.channel, ""
	if !a.ls.permit() {
		ch, id = a.f.hub.own, a.id
	}
	var ahead int
	a.w, ahead = a.f.hub.join(ch, a.k.channel, id)
	if a.early && a.ls.permit() && ahead == 0 {
		signal(a.w)
	}
	return a.w, nil
}

// leave runs when the attempt ends without the lock. If a look put its
// mutex waiter in the name's queue, the release script for its id takes
// it out, and if a release granted it the name meanwhile, passes the name
// on to the next waiter: one script, before Acquire returns (the caller
// may try again at once), bounded like the probe of a wait that ran out.
// Without an answer it is left to abandon.
func (a *attempt) leave() {
	if a.w == nil || !a.f.hub.inQueue(a.w) {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(a.ctx), backend.Grace)
	entry := a.entry()
	s, keys, args := a.f.releaseCall(a.k, a.id, a.ls, a.seq, entry)
	err := s.Run(ctx, a.f.c, keys, args...).Err()
	cancel()
	if err != nil {
		a.f.abandon(a.ctx, a.k, a.id, a.ls, a.seq, entry)
	}
}

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

// join adds a waiter on channel ch for the name whose channel is name
// (id: a mutex waiter's) and subscribes to ch if this process did not
// listen on it yet. ahead is the number of waiters on ch before it.
func (h *hub) join(ch, name, id string) (w *waiter, ahead int) {
	w = &waiter{h: h, ch: ch, name: name, id: id, wake: make(chan struct{}, 1)}
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

// isReady reports whether a mutex waiter may join a queue in Redis: the
// server confirmed the subscription its grant is published on.
func (h *hub) isReady() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.ready
}

// queued records that a look put the mutex waiter w in the name's queue
// in Redis.
func (h *hub) queued(w *waiter) {
	h.mu.Lock()
	defer h.mu.Unlock()
	w.queued = true
}

// inQueue reports whether a look put w in the name's queue in Redis.
func (h *hub) inQueue(w *waiter) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return w.queued
}

// waiting reports how many callers wait on the name of channel ch:
// semaphore waiters, and mutex waiters that joined its queue in Redis.
func (h *hub) waiting(ch string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := len(h.chans[ch])
	for _, w := range h.chans[h.own] {
		if w.name == ch && w.queued {
			n++
		}
	}
	return n
}

// leave takes w out of the hub, if it is still in. For a semaphore or
// readers, a wake w did not use (it gave up, or got the lock through an
// earlier wake) passes to the next waiter, and so does the turn after a
// permit was taken: another permit may be free, another reader may join.
func (h *hub) leave(w *waiter) {
	h.mu.Lock()
	if w.done {
		h.mu.Unlock()
		return
	}
	w.done = true
	ws := h.chans[w.ch]
	if i := slices.Index(ws, w); i >= 0 {
		ws = slices.Delete(ws, i, i+1)
	}
	select {
	case <-w.wake: // a wake it did not use
	default:
	}
	if len(ws) > 0 {
		h.chans[w.ch] = ws
		if w.ch != h.own {
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
		// The factory's own channel stays while the connection does
		// (lingerTime after the last waiter): the next waiter can join a
		// queue at once.
		if _, ok := h.chans[ch]; !ok && ch != h.own {
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
	h.ps, h.ready = nil, false
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
	h.ps, h.ready = nil, false
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
				// then wake every waiter. Until then grants may be lost:
				// no waiter joins a queue, and every waiter looks at once,
				// so that a wait learns of an outage when it begins, not
				// at its deadline.
				h.broken()
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
			if m.Channel == h.own {
				h.granted(m.Payload)
			} else {
				h.notify(m.Channel)
			}
		case *redis.Subscription:
			if m.Kind == "subscribe" {
				h.confirmed(m.Channel)
			}
		}
	}
}

// broken wakes every waiter after the connection broke.
func (h *hub) broken() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ready = false
	for _, ws := range h.chans {
		for _, w := range ws {
			signal(w)
		}
	}
}

// confirmed handles the server's confirmation of a subscription to ch:
// the first waiter of a name's channel looks again, and every mutex
// waiter, on the factory's own channel, looks again and may now join.
func (h *hub) confirmed(ch string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	ws := h.chans[ch]
	if ch != h.own {
		if len(ws) > 0 {
			signal(ws[0])
		}
		return
	}
	h.ready = true
	for _, w := range ws {
		signal(w)
	}
}

// granted handles a release's grant, "<id>:<token>:<ttl ms>:<lock key>":
// the name was the waiter's when it was sent, so the waiter looks again
// (see hub). A grant for an id this factory neither waits for nor holds
// is given on to the next waiter.
func (h *hub) granted(msg string) {
	parts := strings.SplitN(msg, ":", 4)
	if len(parts) != 4 {
		return
	}
	id := parts[0] + ":"
	tok, err1 := strconv.ParseUint(parts[1], 10, 64)
	ttl, err2 := strconv.ParseInt(parts[2], 10, 64)
	if err1 != nil || err2 != nil || tok == 0 {
		return
	}
	h.mu.Lock()
	for _, w := range h.chans[h.own] {
		if w.id == id {
			signal(w)
			h.mu.Unlock()
			return
		}
	}
	h.mu.Unlock()
	if h.f.rn.holds(id) {
		return // it took the lock by its own look before this message came
	}
	base, ok := strings.CutSuffix(parts[3], "lock")
	if !ok {
		return
	}
	// The copy's number is not known: every request sent so far is
	// older than the mark (another attempt's refused request looks again).
	h.f.abandon(context.Background(), keysOfBase(base).of(h.f.id), id, lease{ttl: time.Duration(ttl) * time.Millisecond, limit: 1}, h.f.seq.Load(), "")
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
	h.ps, h.ready = nil, false
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
