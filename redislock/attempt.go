package redislock

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/ubgo/lock"
	"github.com/ubgo/lock/backend"
)

// attempt is one Acquire's attempts against Redis, made on the goroutine
// that waits (backend.Wait's) and only there: the name's keys, the lease
// and the id, the same for every attempt of the call, and the waiter once
// it waits.
type attempt struct {
	f     *Factory
	ctx   context.Context
	name  string
	o     *lock.Options
	k     keys
	ls    lease
	id    string // random, unique per call (see newID)
	seq   uint64 // the number of the last request sent (see Factory.seq)
	renew bool
	early bool    // it waits in the hub from before its first look (see waiting)
	w     *waiter // its place in the hub, once it waits
}

func (f *Factory) newAttempt(ctx context.Context, name string, o *lock.Options, renew bool) *attempt {
	a := &attempt{f: f, ctx: ctx, name: name, o: o, k: keysFor(o.KeyPrefix, name).of(f.id), ls: f.leaseOf(o), id: newID(), renew: renew}
	// A mutex waiter is in the hub before its first look, so that no
	// grant is missed; a permit's, only behind others of this process
	// that wait for the name, so as not to overtake them.
	a.early = o.Wait && (!a.ls.permit() || f.hub.waiting(a.k.channel) > 0)
	return a
}

// reply is the acquire script's answer to one attempt.
type reply struct {
	status int // 1 acquired, 0 held, -1 limit mismatch, -3 look again (a newer request of the factory took the name)
	token  uint64
	retry  time.Duration // held: when to look again
	limit  int
	sent   time.Time
}

// try is one attempt (backend.Wait's): the lock, or on contention
// ErrLocked and when to look again. A mutex waiter joins the name's queue
// in Redis by it once its factory's subscription is confirmed, so that
// its grant is heard; the grant finds it there, and its next try finds
// the name its own.
func (a *attempt) try() (*Holder, time.Duration, error) {
	if err := a.ctx.Err(); err != nil {
		return nil, 0, err
	}
	ch := ""
	if a.mutexWaiter() && a.f.hub.isReady() {
		ch = a.f.hub.own
	}
	r, err := a.run(ch)
	// A request refused as older than one of the factory's that took the
	// name since (the seen mark) looks again at once, with a new number.
	for i := 0; err == nil && r.status == -3; i++ {
		if i == 2 {
			return nil, time.Millisecond, ErrLocked
		}
		r, err = a.run(ch)
	}
	switch {
	case err != nil:
		return nil, 0, err
	case r.status == 0:
		return nil, a.held(r, ch != ""), ErrLocked
	case r.status < 0:
		return nil, 0, fmt.Errorf("redislock: %w: %q is held with limit %d, caller asked for %d", lock.ErrLimitMismatch, a.name, r.limit, a.ls.limit)
	}
	return a.admit(r)
}

// mutexWaiter reports whether the attempt waits in a mutex's queue.
func (a *attempt) mutexWaiter() bool { return a.w != nil && !a.ls.permit() }

// held records a try that found the name held, and that queued the
// attempt if it did, and returns when to look again.
func (a *attempt) held(r reply, queued bool) time.Duration {
	retry := max(r.retry, time.Millisecond)
	if a.mutexWaiter() {
		// Also within its own lease: a waiter ahead of it may be granted
		// the name and die, and hold it that long.
		retry = min(retry, a.ls.ttl)
	}
	if queued {
		a.f.hub.queued(a.w)
	}
	return retry
}

// run sends the acquire script of the attempt's kind; ch is the channel
// of a mutex waiter that joins the queue ("" for none). A request that
// got no reply is abandoned.
func (a *attempt) run(ch string) (reply, error) {
	k, ls, ttl, keep := a.k, a.ls, a.ls.ttl.Milliseconds(), tokenRetention.Milliseconds()
	kl := []string{k.lock, k.token, k.seen, k.permits, k.queue}
	a.seq = a.f.seq.Add(1)
	seq := a.seq
	sent := time.Now()
	var cmd *redis.Cmd
	switch {
	case ls.shared:
		wait := "0"
		if ls.wait {
			wait = "1"
		}
		cmd = sharedAcquire.Run(a.ctx, a.f.c, kl, semID(a.id), ttl, ls.meta, keep, wait, seq)
	case ls.limit == 1 && !ls.wait:
		cmd = mutexAcquire.Run(a.ctx, a.f.c, kl[:4], a.id, ttl, sent.UnixMilli(), ls.meta, keep, seq)
	case ls.limit == 1:
		waits := "w"
		if a.w != nil && a.f.hub.inQueue(a.w) {
			waits = "q"
		}
		cmd = mutexAcquire.Run(a.ctx, a.f.c, kl, a.id, ttl, sent.UnixMilli(), ls.meta, keep, seq, waits, ch)
	default:
		cmd = semAcquire.Run(a.ctx, a.f.c, kl[:4], semID(a.id), ttl, ls.limit, ls.meta, keep, seq)
	}
	res, err := cmd.Result()
	if err != nil {
		a.f.unreachable(err)
		entry := ""
		if ch != "" {
			entry = a.entry()
		}
		a.f.abandon(a.ctx, k, a.id, ls, seq, entry)
		return reply{sent: sent}, fmt.Errorf("redislock: acquire: %w", err)
	}
	r, err := parseReply(res)
	r.sent = sent
	return r, err
}

// parseReply reads an acquire script's reply (see lua/mutex_acquire.lua).
func parseReply(res any) (reply, error) {
	var r reply
	arr, ok := res.([]any)
	if !ok { // acquired: the reply is the token
		tok, err := toUint(res)
		if err != nil || tok == 0 {
			return r, fmt.Errorf("redislock: acquire: bad reply %v", res)
		}
		r.status, r.token = 1, tok
		return r, nil
	}
	if len(arr) < 2 {
		return r, fmt.Errorf("redislock: acquire: unexpected reply %v", res)
	}
	st, _ := toInt(arr[0])
	r.status = int(st)
	switch r.status {
	case 0:
		ms, _ := toInt(arr[1])
		r.retry = time.Duration(ms) * time.Millisecond
		if ms < 0 {
			// A key without expiry (an operator's SET): when it ends is
			// unknown, so poll at the longest interval.
			r.retry = maxPoll
		}
	case -1:
		lim, _ := toInt(arr[1])
		r.limit = int(lim)
	case -3: // look again
		return r, nil
	default:
		return r, fmt.Errorf("redislock: acquire: unexpected reply %v", res)
	}
	return r, nil
}

// admit registers the holder of a confirmed acquire before it is handed
// out: renewal and loss watching (the factory's renewer), WithMaxHold,
// and with WithReplicaAck the replicas' acknowledgement.
func (a *attempt) admit(r reply) (*Holder, time.Duration, error) {
	h := a.f.newHolder(a, r)
	if !a.f.rn.add(h) {
		h.Release()
		return nil, 0, lock.ErrClosed
	}
	h.state.Bound(h.opts, ErrLockLost, nil, h.lose)
	if a.f.replicaAck() > 0 {
		if err := a.replicate(h); err != nil {
			h.Release()
			return nil, 0, err
		}
	}
	return h, 0, nil
}

// replicate waits until the lock h was just given reached the factory's
// WithReplicaAck replicas: an extend and a WAIT in one pipeline on the
// name's primary (extendOnce). Replication keeps the primary's order, so
// the acknowledgement of the extend covers the acquire or hand-off before
// it.
func (a *attempt) replicate(h *Holder) error {
	ctx, cancel := context.WithTimeout(a.ctx, h.ls.ttl/3)
	defer cancel()
	v, err := h.extendOnce(ctx)
	switch {
	case err != nil:
		return fmt.Errorf("redislock: acquire %q: %w", h.name, err)
	case v != 1:
		return fmt.Errorf("redislock: acquire %q: %w before it reached the replicas", h.name, ErrLockLost)
	}
	return nil
}

// entry is the attempt's entry in a mutex's queue (see
// lua/mutex_acquire.lua), by which it leaves the queue.
func (a *attempt) entry() string {
	ttl := strconv.FormatInt(a.ls.ttl.Milliseconds(), 10)
	ch := a.f.hub.own
	return a.id + ttl + ":" + strconv.Itoa(len(ch)) + ":" + ch + a.ls.meta
}

// abandon cleans up after an attempt that failed without a reply: the
// script may have run, or run in part, and its reply been lost, or it may
// still be on its way. So it releases the lock by the attempt's id (unique,
// so this cannot touch anyone else's), takes its entry out of the queue
// if it may have joined it (entry, "" if not), and raises the factory's
// seen mark to the request's number (seq), so that the request takes
// nothing if it runs later. It runs in the background, bounded by its own
// timeout: the caller's ctx may be over, and a server that does not answer
// would otherwise keep the caller waiting for that long. Close waits for
// it.
func (f *Factory) abandon(ctx context.Context, k keys, id string, ls lease, seq uint64, entry string) {
	f.mu.Lock()
	tracked := !f.closed // Close may be waiting on wg already
	if tracked {
		f.wg.Add(1)
	}
	f.mu.Unlock()
	go func() {
		if tracked {
			defer f.wg.Done()
		}
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), min(ls.ttl, backend.ReleaseTimeout))
		defer cancel()
		s, keys, args := f.releaseCall(k, id, ls, seq, entry)
		s.Run(cctx, f.c, keys, args...)
	}()
}

// lease holds what an acquisition needs of its call's options.
type lease struct {
	ttl    time.Duration
	margin time.Duration // the holder gives up this long before the server's expiry
	limit  int
	meta   string // owner and metadata as stored for Inspect (the acquire's: a holder drops it, see held)
	shared bool   // WithShared: a reader, kept like a semaphore permit
	wait   bool   // WithWait
}

// held is ls as a holder keeps it: without what only the acquire needs.
func (ls lease) held() lease {
	ls.meta = ""
	return ls
}

// permit reports whether the holder is a member of the name's sorted set
// of permits (a semaphore permit or a reader) rather than a mutex's value.
func (ls lease) permit() bool { return ls.limit > 1 || ls.shared }

// leaseOf turns resolved options into the lease of one acquisition.
func (f *Factory) leaseOf(o *lock.Options) lease {
	ttl := cmp.Or(o.TTL, DefaultTTL).Truncate(time.Millisecond) // what Redis stores
	m := f.meta
	if o != &f.cfg.Options {
		m = f.metaOf(o)
	}
	return lease{ttl: ttl, margin: ttl/10 + 2*time.Millisecond, limit: o.Limit(), meta: m, shared: o.Shared, wait: o.Wait}
}

// metaOf is owner and metadata as stored for Inspect.
func (f *Factory) metaOf(o *lock.Options) string {
	// A string and a map of strings always marshal.
	m, _ := json.Marshal(meta{Owner: cmp.Or(o.Owner, f.owner), Metadata: o.Metadata})
	return string(m)
}
