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

// Waiting. A mutex waiter joins the name's queue in Redis, kept in the
// lock's value (see lua/mutex_acquire.lua), and a release hands the name
// to the first waiter in the same script: it sets the lock to the
// waiter's id, with a fresh lease and the next token, and publishes the
// id and token on the waiter's factory channel. Each factory has one such
// channel (hub.own), subscribed on its one pub/sub connection while it has
// waiters (and lingerTime after), whatever names they wait for, so one
// release wakes one waiter of one process, and nobody can overtake the
// queue. A waiter joins only once the server confirmed that subscription
// (hub.ready); the confirmation, and the one after a reconnect, make every
// waiter of the factory look again: one that was granted the name while
// the connection was down finds it is its own, one that was skipped
// (nobody listened) joins again. A grant for an id the factory no longer
// waits for or holds (a waiter that gave up, a copy of its attempt that
// queued late) is released at once, to the next waiter.
//
// Every look that finds the name held tells the waiter when to look
// again: within its own TTL, and once queued no later than the end of the
// holder's lease. So a waiter never depends on a wake alone: a holder
// that is killed, or a waiter granted the name and killed, is followed
// within one lease. A grant only wakes the waiter: it takes the name by
// its next look, which finds its own id in the lock and renews the lease.
// A grant read late (the waiter's process was paused, or the message was
// slow) may have run out and the name passed on; only Redis can say, so
// the grant is never taken as the lock by itself.
//
// Semaphores keep the wake of before: their release publishes on the
// name's channel, and the factory, subscribed to the channels of the
// names its callers wait for, wakes the first of its waiters of the name
// (FIFO within the process), which retries; the ones behind it get their
// turn when it takes a permit (another may be free) or gives up. A new
// subscription, and the re-subscription after a reconnect, wakes the
// first waiter of its channel once the server confirms it (go-redis sends
// SUBSCRIBE without waiting for the reply, so the look may have come
// first).
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

// waiter is one waiting Acquire's place in the queue of its channel.
type waiter struct {
	h    *hub
	ch   string
	key  string        // the name's channel, which identifies the name
	id   string        // a mutex waiter's id ("<id>:")
	wake chan struct{} // buffered 1
	// leave runs once the waiter is done without the lock, if set.
	leave func()
	// Guarded by h.mu (joined is written on the waiting goroutine, which
	// reads it without).
	joined bool // a look put it in the name's queue in Redis
	done   bool
	// On the waiting goroutine only.
	// skip: the look before Subscribe queued it while the factory was
	// subscribed already, so the look backend.Wait makes right after
	// Subscribe (for a release in between) is not needed: a grant wakes it.
	skip bool
	hint time.Duration // the hint of the last look
	// acquired: the wait ended with the lock, set by the attempt that got
	// it (on the waiting goroutine, before Close).
	acquired bool
}

// Wake returns the channel a release of the name, or the server's
// confirmation of the subscription, sends on.
func (w *waiter) Wake() <-chan struct{} { return w.wake }

// Close takes the waiter out of the queue. It may be called more than
// once.
func (w *waiter) Close() {
	if w.h.leave(w) && w.leave != nil && !w.acquired {
		w.leave()
	}
}

// look is one attempt of take. A mutex waiter w joins the name's queue
// once the factory's subscription is confirmed; a grant finds it there,
// and its next look finds the name its own. On contention a.pttl says
// when to look again.
func (f *Factory) look(ctx context.Context, k keys, id string, ls lease, w *waiter) (attempt, error) {
	if w == nil || ls.permit() {
		a, err := f.try(ctx, k, id, ls, "")
		a.pttl = max(a.pttl, time.Millisecond)
		return a, err
	}
	if w.skip {
		// A grant since the look that queued it left a wake: the wait
		// looks again at once.
		w.skip = false
		return attempt{pttl: w.hint}, nil
	}
	ch := ""
	if f.hub.isReady() {
		ch = f.hub.own
	}
	a, err := f.try(ctx, k, id, ls, ch)
	if err == nil && a.status == 0 {
		// Also within its own lease: a waiter ahead of it may be granted
		// the name and die, and hold it that long.
		a.pttl = min(max(a.pttl, time.Millisecond), ls.ttl)
		f.hub.looked(w, a.pttl, ch != "")
	}
	return a, err
}

// leaveQueue runs when the mutex waiter w is done without the lock. If it
// joined the name's queue, the release script for its id takes it out,
// and if a release granted it the name meanwhile, passes the name on to
// the next waiter: one script, before Acquire returns (the caller may try
// again at once), bounded like the probe of a wait that ran out. Without
// an answer it is left to the background, as after a failed attempt.
func (f *Factory) leaveQueue(ctx context.Context, k keys, id string, ls lease, w *waiter) {
	if !w.joined {
		return
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), backend.Grace)
	s, keys, args := f.releaseCall(k, id, ls)
	err := s.Run(cctx, f.c, keys, args...).Err()
	cancel()
	if err != nil {
		f.abandon(ctx, k, id, ls)
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

// join queues a semaphore or reader waiter on ch and subscribes to ch if
// this process did not listen on it yet. ahead is the number of waiters
// queued before it.
func (h *hub) join(ch string) (w *waiter, ahead int) {
	w = &waiter{h: h, ch: ch, key: ch, wake: make(chan struct{}, 1)}
	return w, h.add(w)
}

// addMutex adds the waiter of a mutex acquisition, id, on the name whose
// channel is key, to the factory's own channel; leave runs if it ends
// without the lock after it joined the name's queue.
func (h *hub) addMutex(key, id string) *waiter {
	w := &waiter{h: h, ch: h.own, key: key, id: id, wake: make(chan struct{}, 1)}
	h.add(w)
	return w
}

// add queues w on its channel and subscribes if needed; it returns the
// number of waiters ahead of it.
func (h *hub) add(w *waiter) int {
	h.mu.Lock()
	if h.chans == nil {
		h.chans = map[string][]*waiter{}
	}
	ws, listening := h.chans[w.ch]
	h.chans[w.ch] = append(ws, w)
	closed := h.closed
	h.mu.Unlock()
	if !listening && !closed {
		h.sync()
	}
	return len(ws)
}

// isReady reports whether a mutex waiter may join a queue in Redis: the
// server confirmed the subscription its grant is published on.
func (h *hub) isReady() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.ready
}

// looked records a look of w that found the name held, and whether it
// joined the name's queue.
func (h *hub) looked(w *waiter, hint time.Duration, joined bool) {
	w.hint = hint
	if joined {
		h.mu.Lock()
		w.joined = true
		h.mu.Unlock()
	}
}

// waiting reports how many callers wait on the name of channel ch:
// semaphore waiters, and mutex waiters that joined its queue in Redis.
func (h *hub) waiting(ch string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := len(h.chans[ch])
	for _, w := range h.chans[h.own] {
		if w.key == ch && w.joined {
			n++
		}
	}
	return n
}

// leave takes w out of the queue; it reports false if it was out already.
// For a semaphore or readers, a wake w did not use (it gave up, or got
// the lock through an earlier wake) passes to the next waiter, and so
// does the turn after a permit was taken: another permit may be free,
// another reader may join.
func (h *hub) leave(w *waiter) bool {
	h.mu.Lock()
	if w.done {
		h.mu.Unlock()
		return false
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
		return true
	}
	delete(h.chans, w.ch)
	if h.closed {
		h.mu.Unlock()
		return true
	}
	// Unsubscribe in the background: the caller need not wait for it,
	// which could take a dial timeout while Redis is away.
	h.f.wg.Add(1)
	h.mu.Unlock()
	go func() {
		defer h.f.wg.Done()
		h.sync()
	}()
	return true
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
				h.grant(m.Payload)
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

// grant handles a release's grant, "<id>:<token>:<ttl ms>:<lock key>":
// the name was the waiter's when it was sent, so the waiter looks again
// (see hub). A grant for an id this factory neither waits for nor holds
// is given on to the next waiter.
func (h *hub) grant(msg string) {
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
	h.f.abandon(context.Background(), keysOfBase(base), id, lease{ttl: time.Duration(ttl) * time.Millisecond, limit: 1})
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
