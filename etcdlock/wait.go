package etcdlock

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/backend"
)

// Waiting. A waiting Acquire's key is queued in revision order, and the
// transaction that writes it also reads the keys ahead of it (enqueue).
// From then on it sends nothing: it waits for the deletion of the keys
// ahead of it that it waits for, until fewer than its limit are left
// (await). The deletions come from the factory's one watch of its key
// prefix, which also tells holders that their key went (a loss). It is
// not backend.Wait's loop of attempts: a queued key needs no second
// attempt, and nothing polls. The watch misses no deletion of the
// factory's keys, being in place before the first of them is written;
// when it breaks (compaction, no leader) it is set up again, every held
// key is read back and every waiter reads its queue again. Every factory
// watching a prefix is sent each deletion under it: a release costs the
// server one event per watching factory, no request.

// A watcher is the watch of one key prefix for the whole factory, and
// what listens to it: the factory's keys (a deletion of a held key is a
// loss) and the waiters.
type watcher struct {
	f      *Factory
	prefix string
	ready  chan struct{} // closed once the watch is established, or failed (err)
	err    error
	cancel context.CancelFunc

	// Guarded by f.mu.
	refs int
	idle *time.Timer
	dead bool

	// Guarded by mu, with the waiters' fields.
	mu      sync.Mutex
	gen     uint64 // counts the times the watch was set up again
	keys    map[string]*entry
	waiters map[string]map[*waiter]struct{} // by slots directory
}

// entry is one of the factory's keys under the prefix. Key names are used
// again, so deletions are told apart by revision: a deletion at or below
// the key's create revision was of an earlier key of the same name.
type entry struct {
	claim   uint64
	gen     uint64  // the watch generation its deletions are known from
	h       *Holder // nil until admitted
	goneRev int64   // the latest deletion seen before it was admitted
}

// admitted is what admit found.
type admitted int

const (
	held       admitted = iota
	gone                // the key is gone
	unverified          // the watch was set up again since the key was written: read it back
)

type deletion struct {
	key string
	rev int64
}

// A waiter is one queued attempt's subscription to the watch: the
// deletions under its slots directory it has yet to look at. Its fields
// are guarded by the watcher's mu; wake only signals.
type waiter struct {
	w      *watcher
	slots  string
	wake   chan struct{} // 1-buffered: something to look at
	dels   []deletion
	resync bool // deletions may have been missed: read the queue again
}

// subscribe starts collecting the deletions under slots, for an attempt
// about to write its key there.
func (w *watcher) subscribe(slots string) *waiter {
	wt := &waiter{w: w, slots: slots, wake: make(chan struct{}, 1)}
	w.mu.Lock()
	set := w.waiters[slots]
	if set == nil {
		set = map[*waiter]struct{}{}
		w.waiters[slots] = set
	}
	set[wt] = struct{}{}
	w.mu.Unlock()
	return wt
}

// Wake returns the channel that tells of deletions to look at.
func (wt *waiter) Wake() <-chan struct{} { return wt.wake }

// Close ends the subscription.
func (wt *waiter) Close() {
	w := wt.w
	w.mu.Lock()
	delete(w.waiters[wt.slots], wt)
	if len(w.waiters[wt.slots]) == 0 {
		delete(w.waiters, wt.slots)
	}
	w.mu.Unlock()
}

// next returns the deletions since the last call, and whether the queue
// must be read again.
func (wt *waiter) next() ([]deletion, bool) {
	wt.w.mu.Lock()
	defer wt.w.mu.Unlock()
	dels, resync := wt.dels, wt.resync
	wt.dels, wt.resync = nil, false
	return dels, resync
}

// tellLocked adds d to what the waiter has to look at. w.mu is held.
func (wt *waiter) tellLocked(d deletion) {
	wt.dels = append(wt.dels, d)
	wt.wakeUp()
}

// resyncLocked tells the waiter that deletions may have been missed.
// w.mu is held.
func (wt *waiter) resyncLocked() {
	wt.resync = true
	wt.wakeUp()
}

func (wt *waiter) wakeUp() {
	select {
	case wt.wake <- struct{}{}:
	default:
	}
}

// watchLinger is how long an unused watch is kept.
const watchLinger = 2 * time.Second

// watchSetup bounds the wait for etcd to confirm a new watch, as opTimeout
// bounds a lease grant: Acquire waits for the watch whatever its context,
// and an etcd that does not answer (down, stopped, without a leader) would
// otherwise hold it for the whole outage.
const watchSetup = opTimeout

// watch returns the established watcher of prefix, with a reference the
// caller drops with unrefWatch.
func (f *Factory) watch(ctx context.Context, prefix string) (*watcher, error) {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return nil, lock.ErrClosed
	}
	w := f.watches[prefix]
	if w == nil {
		wctx, cancel := context.WithCancel(f.ctx)
		w = &watcher{f: f, prefix: prefix, ready: make(chan struct{}), cancel: cancel,
			keys: map[string]*entry{}, waiters: map[string]map[*waiter]struct{}{}}
		f.watches[prefix] = w
		f.goLocked(func() { w.run(wctx) })
	}
	w.refs++
	if w.idle != nil {
		w.idle.Stop()
		w.idle = nil
	}
	f.mu.Unlock()
	select {
	case <-w.ready:
	case <-ctx.Done():
		f.unrefWatch(w)
		return nil, ctx.Err()
	}
	if w.err != nil {
		f.unrefWatch(w)
		return nil, w.err
	}
	return w, nil
}

func (f *Factory) refWatch(w *watcher) {
	f.mu.Lock()
	w.refs++
	f.mu.Unlock()
}

func (f *Factory) unrefWatch(w *watcher) {
	f.mu.Lock()
	defer f.mu.Unlock()
	w.refs--
	if w.refs > 0 || w.dead {
		return
	}
	w.idle = time.AfterFunc(watchLinger, func() {
		f.mu.Lock()
		if w.refs > 0 || w.dead {
			f.mu.Unlock()
			return
		}
		f.dropWatchLocked(w)
		f.mu.Unlock()
		w.cancel()
	})
}

func (f *Factory) dropWatchLocked(w *watcher) {
	w.dead = true
	if w.idle != nil {
		w.idle.Stop()
		w.idle = nil
	}
	if f.watches[w.prefix] == w {
		delete(f.watches, w.prefix)
	}
}

var errWatchClosed = errors.New("etcdlock: watch closed")

func (w *watcher) run(ctx context.Context) {
	established := false
	for ctx.Err() == nil {
		wctx, cancel := context.WithCancel(ctx)
		// Watch itself blocks while the client has no connection, and the
		// creation may never be confirmed: past the bound, wctx ends both.
		setup := time.AfterFunc(watchSetup, cancel)
		wch := w.f.cli.Watch(clientv3.WithRequireLeader(wctx), w.prefix,
			clientv3.WithPrefix(), clientv3.WithFilterPut(), clientv3.WithCreatedNotify())
		var err error
		select {
		case resp, ok := <-wch:
			switch {
			case !ok:
				err = errWatchClosed
			case resp.Err() != nil:
				err = resp.Err()
			case !resp.Created:
				err = errors.New("etcdlock: watch did not start with its creation")
			}
		case <-ctx.Done():
			err = ctx.Err()
		}
		if !setup.Stop() && ctx.Err() == nil {
			err = fmt.Errorf("etcdlock: watch of %q not set up within %v: %w", w.prefix, watchSetup, context.DeadlineExceeded)
		}
		if err != nil {
			cancel()
			if !established {
				w.f.mu.Lock()
				w.f.dropWatchLocked(w)
				w.f.mu.Unlock()
				w.err = err
				close(w.ready)
				return
			}
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
			continue
		}
		if !established {
			established = true
			close(w.ready)
		} else {
			w.resync(ctx)
		}
		w.consume(wch)
		cancel()
	}
}

func (w *watcher) consume(wch clientv3.WatchChan) {
	for resp := range wch {
		if resp.Err() != nil || resp.Canceled {
			return
		}
		for _, ev := range resp.Events {
			if ev.Type == clientv3.EventTypeDelete {
				w.deleted(string(ev.Kv.Key), ev.Kv.ModRevision)
			}
		}
	}
}

// resync runs after the watch was established again: every held key is
// checked, and every waiter reads its queue again.
func (w *watcher) resync(ctx context.Context) {
	w.mu.Lock()
	w.gen++ // keys not yet held are read back by the acquire (see admit)
	held := map[string]int64{}
	for k, e := range w.keys {
		if e.h != nil {
			held[k] = int64(e.h.token)
		}
	}
	for _, set := range w.waiters {
		for wt := range set {
			wt.resyncLocked()
		}
	}
	w.mu.Unlock()
	for key, rev := range held {
		for ctx.Err() == nil {
			resp, err := w.f.cli.Get(ctx, key, clientv3.WithKeysOnly())
			if err == nil {
				if len(resp.Kvs) == 0 || resp.Kvs[0].CreateRevision != rev {
					w.deleted(key, resp.Header.Revision)
				}
				break
			}
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
}

// deleted handles the deletion of key at rev.
func (w *watcher) deleted(key string, rev int64) {
	var lost *Holder
	w.mu.Lock()
	if e := w.keys[key]; e != nil {
		switch {
		case e.h == nil:
			e.goneRev = max(e.goneRev, rev)
		case rev > int64(e.h.token):
			lost = e.h
			delete(w.keys, key)
		}
	}
	if i := strings.LastIndexByte(key, '/'); i >= 0 {
		for wt := range w.waiters[key[:i+1]] {
			wt.tellLocked(deletion{key, rev})
		}
	}
	w.mu.Unlock()
	if lost != nil {
		lost.lose(backend.Loss(ErrLockLost, lock.ErrRemoved, "its key was deleted (lock break, by hand)"))
	}
}

// track registers a key about to be written.
func (w *watcher) track(c claim) {
	w.mu.Lock()
	w.keys[c.key] = &entry{claim: c.id, gen: w.gen}
	w.mu.Unlock()
}

// untrack stops following the key of c, which the watch then no longer
// reports to anyone (our own deletions are no loss); it reports whether
// the key was still followed.
func (w *watcher) untrack(c claim) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	e := w.keys[c.key]
	if e == nil || e.claim != c.id {
		return false
	}
	delete(w.keys, c.key)
	return true
}

// admit records that the key of c is held by h, whose loss its deletion
// is, unless it was deleted, or might have been while the watch was down.
func (w *watcher) admit(c claim, h *Holder) admitted {
	w.mu.Lock()
	defer w.mu.Unlock()
	e := w.keys[c.key]
	switch {
	case e == nil || e.claim != c.id || e.goneRev > int64(h.token):
		if e != nil && e.claim == c.id {
			delete(w.keys, c.key)
		}
		return gone
	case e.gen != w.gen:
		return unverified
	}
	e.h = h
	return held
}

// generation returns the current watch generation.
func (w *watcher) generation() uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.gen
}

// verified records that the key of c was read back in generation gen.
func (w *watcher) verified(c claim, gen uint64) {
	w.mu.Lock()
	if e := w.keys[c.key]; e != nil && e.claim == c.id {
		e.gen = gen
	}
	w.mu.Unlock()
}
