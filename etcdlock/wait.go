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
)

// A watcher follows the deletions under one key prefix for the whole
// factory: one watch, established before the factory's first transaction
// under the prefix, serves every holder (a deleted key is a lost lock) and
// every waiter (a deleted key ahead of it may be its turn). Because it is in
// place before any of the factory's keys are written, it misses no deletion
// of them, and it is "synced" on the server, which notifies it in the same
// step as the write: a waiter learns of a release without polling.
//
// If the watch breaks (compaction, no leader) it is established again, and
// what happened in between is read back: each held key is checked, and each
// waiter re-reads the keys ahead of it.
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

	mu      sync.Mutex
	gen     uint64 // counts the times the watch was set up again
	keys    map[string]*entry
	waiters map[string]map[*waitState]struct{} // by slots directory
}

// entry is one of the factory's keys under the prefix. Key names are used
// again, so deletions are told apart by revision: a deletion at or below
// the key's create revision was of an earlier key of the same name.
type entry struct {
	claim   uint64
	gen     uint64  // the watch generation its deletions are known from
	h       *Holder // nil until granted
	goneRev int64   // the latest deletion seen before it was granted
}

// holdResult is what hold found.
type holdResult int

const (
	held       holdResult = iota
	deleted               // the key is gone
	unverified            // the watch was set up again since the key was written: read it back
)

type delEvent struct {
	key string
	rev int64
}

// waitState collects the deletions a waiter has yet to look at.
type waitState struct {
	ch     chan struct{} // 1-buffered: something to look at
	mu     sync.Mutex
	evs    []delEvent
	resync bool // events may have been missed: read the queue again
}

func (ws *waitState) push(ev delEvent, resync bool) {
	ws.mu.Lock()
	if resync {
		ws.resync = true
	} else {
		ws.evs = append(ws.evs, ev)
	}
	ws.mu.Unlock()
	select {
	case ws.ch <- struct{}{}:
	default:
	}
}

func (ws *waitState) drain() ([]delEvent, bool) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	evs, resync := ws.evs, ws.resync
	ws.evs, ws.resync = nil, false
	return evs, resync
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
			keys: map[string]*entry{}, waiters: map[string]map[*waitState]struct{}{}}
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
	w.gen++ // keys not yet held are read back by the acquire (see hold)
	held := map[string]int64{}
	for k, e := range w.keys {
		if e.h != nil {
			held[k] = int64(e.h.token)
		}
	}
	for _, set := range w.waiters {
		for ws := range set {
			ws.push(delEvent{}, true)
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
		for ws := range w.waiters[key[:i+1]] {
			ws.push(delEvent{key, rev}, false)
		}
	}
	w.mu.Unlock()
	if lost != nil {
		lost.lose(ErrLockLost)
	}
}

// track registers a key about to be written.
func (w *watcher) track(c claim) {
	w.mu.Lock()
	w.keys[c.key] = &entry{claim: c.id, gen: w.gen}
	w.mu.Unlock()
}

func (w *watcher) untrack(c claim) {
	w.mu.Lock()
	if e := w.keys[c.key]; e != nil && e.claim == c.id {
		delete(w.keys, c.key)
	}
	w.mu.Unlock()
}

// hold records that the key of c is held by h, unless it was deleted, or
// might have been while the watch was down.
func (w *watcher) hold(c claim, h *Holder) holdResult {
	w.mu.Lock()
	defer w.mu.Unlock()
	e := w.keys[c.key]
	switch {
	case e == nil || e.claim != c.id || e.goneRev > int64(h.token):
		if e != nil && e.claim == c.id {
			delete(w.keys, c.key)
		}
		return deleted
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

func (w *watcher) addWaiter(slots string) *waitState {
	ws := &waitState{ch: make(chan struct{}, 1)}
	w.mu.Lock()
	set := w.waiters[slots]
	if set == nil {
		set = map[*waitState]struct{}{}
		w.waiters[slots] = set
	}
	set[ws] = struct{}{}
	w.mu.Unlock()
	return ws
}

func (w *watcher) removeWaiter(slots string, ws *waitState) {
	w.mu.Lock()
	delete(w.waiters[slots], ws)
	if len(w.waiters[slots]) == 0 {
		delete(w.waiters, slots)
	}
	w.mu.Unlock()
}
