package etcdlock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/backend"
)

// The factory's watch of its own keys. Every key the factory writes is
// followed, from before the write until it is deleted or let go, by a
// watch that sees its deletion: the loss of a holder, or a waiter whose
// key went (its lease ended, an operator) and that must queue again. The
// watch covers only the factory's own keys under one name (the range
// <limit>/<factory id>- of the name's directory, or <limit>/~<factory id>-
// for shared keys), so that other processes' acquisitions under the name
// cost it nothing; once the factory has nameWatches such watches under a
// key prefix, further names share one watch of the whole prefix (a
// factory holding thousands of locks keeps a handful of watches, and is
// sent every deletion under that prefix). A watch is in place before the
// first key it covers is written, so it misses no deletion; when it breaks
// (compaction, no leader) it is set up again, every held key it covers is
// read back and its waiters look at the queue again. What wakes a waiter
// when its turn comes is its own watch of the keys ahead of it (wait.go).

// nameWatches is how many names of one key prefix a factory watches one
// by one before it watches the whole prefix.
const nameWatches = 8

// A watcher is one watch of the factory's keys under scope, and what
// listens to it: the keys tracked there (a deletion of a held key is a
// loss; of a waiting one, a wake-up).
type watcher struct {
	f      *Factory
	scope  string        // the watched keys: those that start with it
	prefix string        // the factory's key prefix, whose name watches are counted
	wide   bool          // scope is the whole prefix
	ready  chan struct{} // closed once the watch is established, or failed (err)
	err    error
	cancel context.CancelFunc

	// Guarded by f.mu.
	refs int
	idle *time.Timer
	dead bool

	// Guarded by mu.
	mu   sync.Mutex
	gen  uint64 // counts the times the watch was set up again
	keys map[string]*entry
}

// entry is one of the factory's keys in the watcher's scope. Key names
// are used again, so deletions are told apart by revision: a deletion at
// or below the key's create revision was of an earlier key of the same
// name.
type entry struct {
	claim   uint64
	gen     uint64        // the watch generation its deletions are known from
	h       *Holder       // nil until admitted
	goneRev int64         // the latest deletion seen before it was admitted
	wake    chan struct{} // a waiter's: 1-buffered, told of a deletion or a new watch
}

// admitted is what admit found.
type admitted int

const (
	held       admitted = iota
	gone                // the key is gone
	unverified          // the watch was set up again since the key was written: read it back
)

// watchLinger is how long an unused watch is kept.
const watchLinger = 2 * time.Second

// watchSetup bounds the wait for etcd to confirm a new watch, as opTimeout
// bounds a lease grant: Acquire waits for the watch whatever its context,
// and an etcd that does not answer (down, stopped, without a leader) would
// otherwise hold it for the whole outage.
const watchSetup = opTimeout

// watch returns the established watcher of the factory's keys of q, with
// a reference the caller drops with unrefWatch: the watch of its keys
// under q's name, or of the whole prefix if there is one or the factory
// watches nameWatches names there already.
func (f *Factory) watch(ctx context.Context, q *queue) (*watcher, error) {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return nil, lock.ErrClosed
	}
	own := q.keys + f.id + "-"
	w := f.watches[own]
	if w == nil {
		w = f.watches[q.prefix]
	}
	if w == nil {
		wctx, cancel := context.WithCancel(f.ctx)
		w = &watcher{f: f, scope: own, prefix: q.prefix, ready: make(chan struct{}), cancel: cancel, keys: map[string]*entry{}}
		if f.named[q.prefix] >= nameWatches {
			w.scope, w.wide = q.prefix, true
		} else {
			f.named[q.prefix]++
		}
		f.watches[w.scope] = w
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
	if f.watches[w.scope] == w {
		delete(f.watches, w.scope)
		if !w.wide {
			if f.named[w.prefix]--; f.named[w.prefix] == 0 {
				delete(f.named, w.prefix)
			}
		}
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
		wch := w.f.cli.Watch(clientv3.WithRequireLeader(wctx), w.scope,
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
			err = fmt.Errorf("etcdlock: watch of %q not set up within %v: %w", w.scope, watchSetup, context.DeadlineExceeded)
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
// checked, and every waiter looks at its queue again.
func (w *watcher) resync(ctx context.Context) {
	w.mu.Lock()
	w.gen++ // keys not yet held are read back by the acquire (see admit)
	held := map[string]int64{}
	for k, e := range w.keys {
		if e.h != nil {
			held[k] = int64(e.h.token)
		}
		e.tell()
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
			e.tell()
		case rev > int64(e.h.token):
			lost = e.h
			delete(w.keys, key)
		}
	}
	w.mu.Unlock()
	if lost != nil {
		lost.lose(backend.Loss(ErrLockLost, lock.ErrRemoved, "its key was deleted (lock break, by hand)"))
	}
}

// tell wakes the waiter of e, if it waits. w.mu is held.
func (e *entry) tell() {
	if e.wake != nil {
		select {
		case e.wake <- struct{}{}:
		default:
		}
	}
}

// waitFor returns the channel that tells the waiter whose key is c that
// the key may have gone: a deletion (maybe of an earlier key of the same
// name), or a new watch that may have missed one.
func (w *watcher) waitFor(c claim) <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	e := w.keys[c.key]
	if e == nil || e.claim != c.id {
		return nil
	}
	if e.wake == nil {
		e.wake = make(chan struct{}, 1)
	}
	return e.wake
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
