package redislock

import (
	"context"
	"fmt"
	"maps"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/ubgo/lock"
	"github.com/ubgo/lock/backend"
)

// renewer is the factory's one loop over its held locks. It renews the
// auto-renewed ones in batches (one pipeline per pass, whatever the number
// of locks; on a cluster client one per master) and declares any holder
// lost whose deadline passed without a confirmed acquire or renewal,
// renewed or not. It runs only while the factory holds something, and for
// lingerTime after.
type renewer struct {
	f       *Factory
	mu      sync.Mutex
	holders map[*Holder]struct{}
	running bool
	closed  bool
	kick    chan struct{}
	wakeAt  time.Time // when the loop wakes up next by itself
}

// tracking is what the renewer knows of a holder, guarded by its mu.
type tracking struct {
	auto     bool      // renewed by the factory's loop
	tracked  bool      // in the loop's set: held as far as the holder knows
	inflight bool      // a renewal is on its way
	renewErr error     // the last renewal's failure (reported once), nil after a success
	deadline time.Time // last confirmed send + ttl - margin: lost when it passes
	renewAt  time.Time // a renewal pass from this time on takes this holder along
	renewBy  time.Time // the loop wakes up to renew it at this time
	// releasing: Release's script is on its way and its reply decides. A
	// loss found meanwhile (a renewal or Extend that finds the lock gone
	// may have run after the release on the server; WithMaxHold) is kept
	// in found instead, for a release that gets no reply. The lease
	// deadline and Close do not wait (see loop and drain).
	releasing bool
	found     error
}

// add starts tracking h. It reports false once the factory is closed.
func (r *renewer) add(h *Holder) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return false
	}
	if r.holders == nil {
		r.holders = map[*Holder]struct{}{}
		r.kick = make(chan struct{}, 1)
	}
	r.holders[h] = struct{}{}
	h.tracked = true
	switch {
	case !r.running:
		r.running = true
		r.f.wg.Add(1)
		go r.loop()
	case h.deadline.Before(r.wakeAt) || h.auto && h.renewBy.Before(r.wakeAt):
		r.poke()
	}
	return true
}

func (r *renewer) poke() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// holds reports whether the factory holds the acquisition with this id.
func (r *renewer) holds(id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for h := range r.holders {
		if h.id == id {
			return true
		}
	}
	return false
}

// stopRenewing keeps h's deadline but renews it no more: it is being
// released, and the release's reply decides whether it was lost.
func (r *renewer) stopRenewing(h *Holder) {
	r.mu.Lock()
	h.auto = false
	h.releasing, h.found = true, nil
	r.mu.Unlock()
}

// released ends h's release, answered or not, and returns the loss found
// while it was on its way, if any. h is no longer tracked once the release
// was answered or a loss found; otherwise it stays as it was, renewed no
// more: its deadline decides.
func (r *renewer) released(h *Holder, answered bool) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	found := h.found
	h.releasing, h.found = false, nil
	if answered || found != nil {
		r.dropLocked(h)
	}
	return found
}

// lose ends h's state with err and stops tracking it, in one step under
// r.mu, unless a Release is on its way: err is then kept for it (see
// tracking.releasing). It reports whether h's state took the loss (not if
// h had ended already).
func (r *renewer) lose(h *Holder, err error) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if h.releasing {
		if h.found == nil {
			h.found = err
		}
		return false
	}
	r.dropLocked(h)
	return h.state.Lose(err)
}

// dropLocked stops tracking h. r.mu is held.
func (r *renewer) dropLocked(h *Holder) {
	if h.tracked {
		delete(r.holders, h)
		h.tracked = false
	}
}

// confirm records an extend of h sent at sent that the server accepted. It
// reports false if h is no longer held by its own account.
func (r *renewer) confirm(h *Holder, sent time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !h.tracked {
		return false
	}
	h.confirmLocked(sent)
	return true
}

// drain stops the loop for good and returns the holders it tracked.
func (r *renewer) drain() []*Holder {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closed = true
	var hs []*Holder
	for h := range r.holders {
		// Close does not wait for a Release's reply either: it frees
		// the key itself.
		h.tracked, h.releasing = false, false
		hs = append(hs, h)
	}
	clear(r.holders)
	if r.running {
		r.poke()
	}
	return hs
}

func (r *renewer) loop() {
	defer r.f.wg.Done()
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	var idle time.Time // since when nothing is held
	for {
		r.mu.Lock()
		now := time.Now()
		next := now.Add(time.Hour)
		if len(r.holders) > 0 {
			idle = time.Time{}
		} else if idle.IsZero() {
			idle = now
		}
		// Linger a little when nothing is held, so that a factory that
		// takes and releases locks all the time keeps one loop.
		if r.closed || !idle.IsZero() && now.Sub(idle) >= lingerTime {
			r.running = false
			r.mu.Unlock()
			return
		}
		if !idle.IsZero() {
			next = idle.Add(lingerTime)
		}
		var due, expired []*Holder
		for h := range r.holders {
			if !now.Before(h.deadline) {
				delete(r.holders, h)
				// The deadline does not wait for a Release's reply: the
				// holder stops before Redis can free the key.
				h.tracked, h.releasing = false, false
				expired = append(expired, h)
				continue
			}
			next = earlier(next, h.deadline)
			if !h.auto || h.inflight {
				continue
			}
			if !now.Before(h.renewAt) {
				h.inflight = true
				due = append(due, h)
			} else {
				next = earlier(next, h.renewBy)
			}
		}
		r.wakeAt = next
		r.mu.Unlock()
		for _, h := range expired {
			r.f.wg.Add(1)
			go h.expire()
		}
		if len(due) > 0 {
			r.f.wg.Add(1)
			go r.renew(due)
		}
		t.Reset(next.Sub(now))
		select {
		case <-t.C:
		case <-r.kick:
		}
	}
}

type result struct {
	v   int64
	err error
}

// extendAll runs the extend script for every holder in one pipeline on c,
// in batches of mutexes of one TTL if batch is set.
func (r *renewer) extendAll(ctx context.Context, c Client, hs []*Holder, batch bool) map[*Holder]result {
	// A job is one script call: a batch of mutexes, or one holder.
	var jobs [][]*Holder
	var many []bool
	cur := map[time.Duration][]*Holder{}
	for _, h := range hs {
		if batch && !h.ls.permit() {
			b := append(cur[h.ls.ttl], h)
			if len(b) == renewBatch {
				jobs, many, b = append(jobs, b), append(many, true), nil
			}
			cur[h.ls.ttl] = b
			continue
		}
		jobs, many = append(jobs, []*Holder{h}), append(many, false)
	}
	for _, b := range cur {
		if len(b) > 0 {
			jobs, many = append(jobs, b), append(many, true)
		}
	}
	cmds := pipeScriptsAcked(ctx, c, len(jobs), func(i int) (*redis.Script, []string, []any) {
		job := jobs[i]
		if !many[i] {
			h := job[0]
			return extendCall(h.k, h.id, h.ls)
		}
		keys := make([]string, len(job))
		args := make([]any, 1, 1+len(job))
		args[0] = job[0].ls.ttl.Milliseconds()
		for j, h := range job {
			keys[j] = h.k.lock
			args = append(args, h.id)
		}
		return mutexExtendN, keys, args
	}, r.f.replicaAck())
	results := make(map[*Holder]result, len(hs))
	var again []*Holder
	for i, job := range jobs {
		if !many[i] {
			v, err := cmds[i].Int64()
			results[job[0]] = result{v, err}
			continue
		}
		vs, err := cmds[i].Int64Slice()
		if redis.HasErrorPrefix(err, "CROSSSLOT") {
			// A plain client on a cluster node: renew one by one from now on.
			r.f.together.Store(false)
			again = append(again, job...)
			continue
		}
		if err == nil && len(vs) != len(job) {
			err = fmt.Errorf("redislock: renew: %d replies for %d locks", len(vs), len(job))
		}
		for j, h := range job {
			if err != nil {
				results[h] = result{0, err}
			} else {
				results[h] = result{vs[j], nil}
			}
		}
	}
	if len(again) > 0 {
		maps.Copy(results, r.extendAll(ctx, c, again, false))
	}
	return results
}

func earlier(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// renewBatch is how many mutexes one script renews where all keys live
// on one server: large enough to make the cost of a script call small
// beside the work, small enough not to hold the server up for long.
const renewBatch = 200

// renew extends every holder in hs in one pipeline; on a cluster client in
// one pipeline per master, each applied as it returns, so that a master
// that does not answer holds up only the locks it owns. (A pipeline of the
// cluster client returns only once every node answered or go-redis gave
// up on it, seconds after a master died: long enough to lose the locks on
// every other master.)
func (r *renewer) renew(hs []*Holder) {
	defer r.f.wg.Done()
	cc, ok := r.f.c.(*redis.ClusterClient)
	if !ok {
		r.renewOn(nil, r.f.c, hs, r.f.together.Load())
		return
	}
	ctx, cancel := r.passContext(hs)
	groups := map[Client][]*Holder{}
	for _, h := range hs {
		var c Client = cc // slot owner unknown: the cluster client finds it
		if node, err := cc.MasterForKey(ctx, h.k.lock); err == nil {
			c = node
		}
		groups[c] = append(groups[c], h)
	}
	cancel()
	var wg sync.WaitGroup
	for c, g := range groups {
		wg.Go(func() { r.renewOn(cc, c, g, false) })
	}
	wg.Wait()
}

// passContext bounds a renewal pass by the earliest lease deadline of its
// holders: a reply after it is of no use to that holder, and go-redis'
// retries must not keep the pass (and its other holders) waiting longer.
func (r *renewer) passContext(hs []*Holder) (context.Context, context.CancelFunc) {
	end := time.Now().Add(backend.ReleaseTimeout)
	r.mu.Lock()
	for _, h := range hs {
		end = earlier(end, h.deadline)
	}
	r.mu.Unlock()
	return context.WithDeadline(context.Background(), end)
}

// renewOn extends every holder in hs in one pipeline on c and applies the
// results. If c is a master of the cluster client cc, holders it redirects
// (MOVED, ASK: their slot moved) are tried again through cc, which follows
// the redirect.
func (r *renewer) renewOn(cc *redis.ClusterClient, c Client, hs []*Holder, batch bool) {
	ctx, cancel := r.passContext(hs)
	defer cancel()
	sent := time.Now()
	results := r.extendAll(ctx, c, hs, batch)
	if cc != nil && c != Client(cc) {
		var moved []*Holder
		for _, h := range hs {
			if err := results[h].err; redis.HasErrorPrefix(err, "MOVED") || redis.HasErrorPrefix(err, "ASK") {
				moved = append(moved, h)
			}
		}
		if len(moved) > 0 {
			maps.Copy(results, r.extendAll(ctx, cc, moved, false))
		}
	}
	type failure struct {
		h   *Holder
		err error
	}
	var lost, stray []*Holder
	var failed []failure
	r.mu.Lock()
	now := time.Now()
	for _, h := range hs {
		h.inflight = false
		v, err := results[h].v, results[h].err
		switch {
		case err != nil:
			if len(failed) == 0 {
				r.f.unreachable(err)
			}
			if h.tracked {
				// Try again soon; the deadline decides when to give up.
				retry := min(max(h.ls.ttl/10, time.Millisecond), time.Second)
				h.renewAt, h.renewBy = now.Add(retry), now.Add(retry)
				err = fmt.Errorf("redislock: renew %q: %w", h.name, err)
				if h.renewErr == nil { // report the first failure, not every retry
					failed = append(failed, failure{h, err})
				}
				h.renewErr = err
			}
		case v == 1 && h.tracked:
			h.renewErr = nil
			h.confirmLocked(sent)
		case v == 1:
			// Extended on the server after the holder gave the lock up.
			stray = append(stray, h)
		case h.tracked:
			h.auto = false // lost below, unless a Release on its way decides
			h.left.Store(false)
			lost = append(lost, h)
		}
	}
	r.poke()
	r.mu.Unlock()
	for _, x := range failed {
		// Retried until the deadline; a loss gets its own line.
		h := x.h
		backend.ReportRetried(h.ctx, h.opts, lock.Event{Backend: backendName, Op: lock.OpExtend, Name: h.name, Token: h.token, Latency: now.Sub(sent), Err: x.err})
	}
	for _, h := range lost {
		h.lose(backend.Loss(ErrLockLost, lock.ErrRemoved, "no longer held at renewal"))
	}
	if len(stray) > 0 {
		rctx, rcancel := backend.ReleaseContext(context.Background())
		r.f.releaseMany(rctx, stray)
		rcancel()
	}
}
