package etcdlock

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/backend"
)

// An attempt is one key of one Acquire, on one lease: written (without
// WithWait, only if a permit is free), with WithWait queued until fewer
// than limit of the keys it waits for are ahead of it (see wait.go), then
// admitted as a holder. Its methods are its phases, in the order they
// run, all on the Acquire's goroutine.
type attempt struct {
	f   *Factory
	ctx context.Context
	q   *queue
	w   *watcher
	s   *session

	c       claim
	val     string    // the key's value, a record
	since   time.Time // when the attempt began: the holder's Since
	rev     int64     // the key's create revision once written: the token
	ahead   []string  // WithWait: its window, the closest limit of the keys it waits for
	all     bool      // no other key it waits for was ahead when ahead was read
	base    int64     // the revision ahead was read at
	blocked time.Time // when it began to wait, if it had to
}

// try puts the key in and returns the holder once it holds a permit.
func (a *attempt) try() (*Holder, error) {
	if err := a.f.settle(a.ctx, a.q.dir); err != nil {
		return nil, err
	}
	a.c, a.since = a.f.claimKey(a.q.keys), time.Now()
	val, _ := json.Marshal(record{Owner: a.q.opts.Owner, Process: a.f.process, Since: a.since, Metadata: a.q.opts.Metadata})
	a.val = string(val)
	var err error
	switch {
	case a.q.wait:
		if err = a.enqueue(); err == nil {
			err = a.await()
		}
	case a.q.shared:
		err = a.tryShared()
	default:
		err = a.tryFree()
	}
	if err != nil {
		return nil, err
	}
	return a.admit()
}

// write runs one transaction that puts the key if cmps hold, and in
// every case checks that the key's name is not still taken by a key of
// this factory that could not be deleted (a lost lock of a dead lease):
// then it takes the next name and runs again. Unless absent says that
// cmps imply it, the key's absence is compared too. The key's own read
// comes after els's responses.
func (a *attempt) write(absent bool, cmps []clientv3.Cmp, then, els []clientv3.Op) (*clientv3.TxnResponse, error) {
	for {
		a.w.track(a.c)
		if !absent {
			cmps = append([]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(a.c.key), "=", 0)}, cmps[:len(cmps):len(cmps)]...)
		}
		then := append([]clientv3.Op{clientv3.OpPut(a.c.key, a.val, clientv3.WithLease(a.s.id))}, then...)
		els := append(els[:len(els):len(els)], clientv3.OpGet(a.c.key, clientv3.WithKeysOnly()))
		resp, err := a.commit(cmps, then, els)
		switch {
		case rejected(err):
			return nil, a.unwritten(err)
		case err != nil:
			a.w.untrack(a.c) // the claim stays with the cleanup
			return nil, fmt.Errorf("etcdlock: acquire: %w", err)
		case resp.Succeeded:
			a.rev = resp.Header.Revision
			return resp, nil
		case len(resp.Responses[len(els)-1].GetResponseRange().Kvs) == 0:
			return resp, nil
		}
		// Left over: skip the name, and check that the next one is absent.
		a.w.untrack(a.c)
		a.c = a.f.claimKey(a.q.keys)
		if absent {
			absent = false
		} else {
			cmps = cmps[1:]
		}
	}
}

// commit runs one transaction that may write the key. The write outlives
// ctx (up to opTimeout) so that its outcome is known: the caller need not
// wait for it, since backend.Take returns within Grace of ctx's end. From
// ctx's end the write is a cleanup of the name, which the factory's next
// attempt at it waits for (settle), so that callers retrying on short
// deadlines leave one key, not one per retry; the key, if written for
// nobody or maybe written (no answer), is then removed (abandon).
func (a *attempt) commit(cmps []clientv3.Cmp, then, els []clientv3.Op) (*clientv3.TxnResponse, error) {
	if !a.f.enter() {
		return nil, lock.ErrClosed
	}
	defer a.f.wg.Done()
	ctx := a.ctx
	if ctx.Done() != nil {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), opTimeout)
		defer cancel()
	}
	pended := make(chan struct{})
	stop := context.AfterFunc(a.ctx, func() { a.f.pend(a.q.dir); close(pended) })
	resp, err := a.f.cli.Txn(ctx).If(cmps...).Then(then...).Else(els...).Commit()
	if stop() { // the caller is still there
		if err != nil && !rejected(err) {
			a.f.pend(a.q.dir)
			a.abandon(0)
		}
		return resp, err
	}
	<-pended // the caller may be gone: the key is the name's cleanup
	switch {
	case err != nil && !rejected(err):
		a.abandon(0)
	case err == nil && resp.Succeeded:
		a.abandon(resp.Header.Revision)
	default:
		a.f.unclaim(a.c)
		a.f.unpend(a.q.dir)
	}
	return nil, a.ctx.Err()
}

// abandon removes in the background the key of a write whose caller left,
// or that got no answer (rev 0: whatever its revision, and again while
// the lease lives, in case the write lands late); until then the name's
// cleanup is pending.
func (a *attempt) abandon(rev int64) {
	f, s, c, dir := a.f, a.s, a.c, a.q.dir
	if !f.spawn(func() { defer f.unpend(dir); f.remove(s, c, rev) }) {
		f.unpend(dir)
	}
}

// tryShared writes a shared key only if no exclusive key is there,
// holding or waiting (writer preference), nor a key of another limit.
func (a *attempt) tryShared() error {
	others, reads := a.q.otherLimits()
	exclusive := clientv3.Compare(clientv3.CreateRevision(a.q.slots).WithRange(a.q.slots+sharedMark), "=", 0)
	resp, err := a.write(false, append([]clientv3.Cmp{exclusive}, others...), nil, reads)
	if err != nil || resp.Succeeded {
		return err
	}
	if err := a.q.mismatched(resp); err != nil {
		return a.unwritten(err)
	}
	return a.unwritten(ErrLocked)
}

// tryFree writes the key only if the name is free, or every key seen is
// still there and a permit was free: then the new key is among the first
// limit. It writes nothing when the name is taken. Either condition also
// says that the key is absent (it was, when the keys were seen).
func (a *attempt) tryFree() error {
	cond := clientv3.Compare(clientv3.CreateRevision(a.q.dir).WithPrefix(), "=", 0)
	first := clientv3.OpGet(a.q.dir, clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithLimit(1))
	for {
		resp, err := a.write(true, []clientv3.Cmp{cond}, nil, []clientv3.Op{first})
		if err != nil || resp.Succeeded {
			return err
		}
		rr := resp.Responses[0].GetResponseRange()
		if rr.Count > 0 {
			if n, _ := limitOf(a.q.dir, string(rr.Kvs[0].Key)); n != a.q.limit {
				return a.unwritten(a.q.mismatch(n))
			}
			if rr.Count >= int64(a.q.limit) {
				return a.unwritten(ErrLocked)
			}
		}
		if err := a.ctx.Err(); err != nil {
			return a.unwritten(err)
		}
		cond = clientv3.Compare(clientv3.ModRevision(a.q.dir).WithPrefix(), "<", resp.Header.Revision+1)
	}
}

// enqueue writes the key unless keys of another limit are there, and
// reads its window in the same transaction: the keys of the name are read
// after the new one, newest first, so the first that it waits for are
// those just ahead of it (its own key comes first among exclusive keys).
func (a *attempt) enqueue() error {
	others, reads := a.q.otherLimits()
	window := a.q.window(a.q.limit + 1)
	if a.q.shared {
		window = a.q.window(a.q.limit)
	}
	for {
		resp, err := a.write(false, others, []clientv3.Op{window}, reads)
		switch {
		case err != nil:
			return err
		case resp.Succeeded:
			a.base = a.rev
			a.ahead = a.ahead[:0]
			rr := resp.Responses[1].GetResponseRange()
			for _, kv := range rr.Kvs {
				if kv.CreateRevision < a.rev {
					a.ahead = append(a.ahead, string(kv.Key))
				}
			}
			a.all = !rr.More && len(a.ahead) <= a.q.limit
			a.ahead = a.ahead[:min(len(a.ahead), a.q.limit)]
			return nil
		}
		if err := a.q.mismatched(resp); err != nil {
			return a.unwritten(err)
		}
		if err := a.ctx.Err(); err != nil {
			return a.unwritten(err)
		}
	}
}

// await waits until fewer than limit keys it waits for are ahead: it
// watches its window and looks again when a key of it goes, when a watch
// of it starts after the revision it was read at, or when its own key
// may have gone.
func (a *attempt) await() error {
	if len(a.ahead) < a.q.limit {
		return nil
	}
	a.blocked = time.Now()
	if !a.q.renew {
		defer a.s.renewWhile()() // a lease that only Extend renews must live through the wait
	}
	wn := newWindow(a.f.cli)
	defer wn.close()
	mine := a.w.waitFor(a.c)
	for len(a.ahead) >= a.q.limit {
		wn.set(a.ahead)
		select {
		case ev := <-wn.events:
			if !slices.Contains(a.ahead, ev.key) || (ev.created != 0 && ev.created <= a.base) {
				continue // an earlier window's, or nothing missed
			}
			if ev.created == 0 && a.all {
				// Every key it waits for is in the window, and none can
				// join it (revisions only grow): one fewer is left. Its
				// own key is still its own unless its lease ended, which
				// admit sees from the session's deadline even after a
				// pause, or someone deleted it, which the factory's watch
				// tells as it tells a holder.
				a.ahead = slices.DeleteFunc(a.ahead, func(k string) bool { return k == ev.key })
				continue
			}
		case <-mine:
		case <-a.s.stop:
			// The lease is lost: the key goes with it (or is deleted);
			// queue again on a new one.
			return a.withdraw(errRequeue)
		case <-a.ctx.Done():
			// Held as far as the watch told; whether etcd still answers,
			// the probe says (see backend.Take).
			return a.withdraw(a.ctx.Err())
		case <-a.f.ctx.Done():
			return a.withdraw(lock.ErrClosed)
		}
		if err := a.look(); err != nil {
			return err
		}
	}
	return nil
}

// look reads the window again, in a transaction that checks that the
// key is still there: an answer of etcd's that is current, whatever the
// waiter was told before (it may have been paused since).
func (a *attempt) look() error {
	resp, err := a.f.cli.Txn(a.ctx).If(clientv3.Compare(clientv3.CreateRevision(a.c.key), "=", a.rev)).
		Then(a.q.window(a.q.limit, clientv3.WithMaxCreateRev(a.rev-1))).Commit()
	switch {
	case err != nil && a.ctx.Err() != nil && errors.Is(err, a.ctx.Err()):
		return a.withdraw(a.ctx.Err()) // the probe decides
	case err != nil:
		return a.withdraw(fmt.Errorf("etcdlock: acquire: %w", err)) // a failure, not contention
	case !resp.Succeeded:
		return a.unwritten(errRequeue)
	}
	a.base = resp.Header.Revision
	a.ahead = a.ahead[:0]
	rr := resp.Responses[0].GetResponseRange()
	for _, kv := range rr.Kvs {
		a.ahead = append(a.ahead, string(kv.Key))
	}
	a.all = !rr.More
	return nil
}

// admit turns the key into a holder, registered with its lease (renewal
// and loss) and the watch (loss), WithMaxHold armed; unless the key went
// while it was written.
func (a *attempt) admit() (*Holder, error) {
	h := &Holder{
		f: a.f, w: a.w, s: a.s, name: a.q.name, key: a.c.key, claim: a.c, token: uint64(a.rev), opts: a.q.opts,
		state: backend.NewState(), ctx: context.WithoutCancel(a.ctx), since: a.since,
	}
	a.f.refWatch(a.w)
	a.f.refSession(a.s)
	if !a.s.addHolder(h) {
		// The lease was declared lost while the key went in.
		h.detach()
		return nil, a.withdraw(errRequeue)
	}
	for {
		switch a.w.admit(a.c, h) {
		case held:
			h.state.Bound(h.opts, ErrLockLost, nil, h.lose)
			return h, nil
		case unverified:
			if a.verify() {
				continue
			}
		}
		// Deleted already (operator, lease ended), or cannot tell: this
		// lock was never safe to use.
		a.s.removeHolder(h)
		h.detach()
		return nil, a.withdraw(errRequeue)
	}
}

// verify reads the key back, written while the watch was set up again.
func (a *attempt) verify() bool {
	gen := a.w.generation()
	ctx, cancel := backend.ReleaseContext(a.ctx)
	defer cancel()
	resp, err := a.f.cli.Get(ctx, a.c.key, clientv3.WithKeysOnly())
	if err != nil || len(resp.Kvs) != 1 || resp.Kvs[0].CreateRevision != a.rev {
		return false
	}
	a.w.verified(a.c, gen)
	return true
}

// unwritten ends an attempt with err whose key is not there: never
// written, or gone before it was admitted.
func (a *attempt) unwritten(err error) error {
	a.w.untrack(a.c)
	a.f.unclaim(a.c)
	if rejected(err) {
		// Revoked behind our back: its locks are lost (the watch tells
		// their holders); take a new lease.
		a.s.die(false, backend.Loss(ErrLockLost, lock.ErrSessionEnded, "lease %x revoked", a.s.id))
		err = errRequeue
	}
	return err
}

// withdraw ends an attempt with err whose key was written: the key is
// deleted before it returns, so that a permit it may just have been
// handed passes on at once.
func (a *attempt) withdraw(err error) error {
	a.w.untrack(a.c)
	a.f.remove(a.s, a.c, a.rev)
	return err
}

// A cleanup counts the keys of a name whose caller moved on while their
// write was in flight, or whose write got no answer: each is deleted in
// the background once the write returns, and until all are, the factory
// writes no new key for the name.
type cleanup struct {
	n    int
	done chan struct{} // closed when n drops to 0
}

// pend and unpend count a cleanup of dir.
func (f *Factory) pend(dir string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	cl := f.cleanups[dir]
	if cl == nil {
		cl = &cleanup{done: make(chan struct{})}
		f.cleanups[dir] = cl
	}
	cl.n++
}

func (f *Factory) unpend(dir string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	cl := f.cleanups[dir]
	if cl.n--; cl.n == 0 {
		delete(f.cleanups, dir)
		close(cl.done)
	}
}

// settle waits until no key of dir is being cleaned up: a caller whose
// write outlived its deadline leaves at most one key per name behind, not
// one per retry, and the key is gone before the factory writes the next.
func (f *Factory) settle(ctx context.Context, dir string) error {
	for {
		f.mu.Lock()
		cl := f.cleanups[dir]
		f.mu.Unlock()
		if cl == nil {
			return nil
		}
		select {
		case <-cl.done:
		case <-ctx.Done():
			return ctx.Err()
		case <-f.ctx.Done():
			return lock.ErrClosed
		}
	}
}

// rejected reports whether err means the transaction was refused, so that
// nothing was written.
func rejected(err error) bool { return errors.Is(err, rpctypes.ErrLeaseNotFound) }
