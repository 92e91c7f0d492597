// Package etcdlock is a lock backend on etcd v3: named mutexes and
// semaphores, each holder a key on a lease, whose fencing tokens are etcd
// revisions, strictly increasing across the whole cluster. Waiters are
// served first come, first served, woken by a watch; a factory shares one
// lease per TTL among its locks and renews it in the background, and a
// holder that cannot renew is told of the loss before the server can free
// its lock.
//
// The guide covers the options, the key layout, loss and its margins,
// when exclusion holds, and the Fence and Ledger stores:
// https://github.com/ubgo/lock/blob/main/docs/guides/etcdlock.md
package etcdlock

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/backend"
)

// Errors, matching the root sentinels with errors.Is.
var (
	ErrLocked   = fmt.Errorf("etcdlock: %w", lock.ErrLocked)
	ErrLockLost = fmt.Errorf("etcdlock: %w", lock.ErrLockLost)
)

const backendName = "etcdlock"

// opTimeout bounds a write whose outcome must be known even after the
// caller's context ended, so that a key written for a caller that gave up
// can be removed.
const opTimeout = backend.ReleaseTimeout

// Factory hands out locks stored in one etcd cluster. Factories are
// independent: two factories contend like two processes. Close it to
// release its locks and stop its background work.
type Factory struct {
	cli     *clientv3.Client
	cfg     backend.Config
	process string // pid@host, stored with every lock
	id      string // random, names this factory's keys

	ctx    context.Context // ends at Close
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu       sync.Mutex
	closed   bool
	sessions map[time.Duration]*session // renewed leases shared by TTL
	private  map[*session]struct{}      // one-holder leases (WithAutoRenew(false))
	watches  map[string]*watcher        // by key prefix
	used     map[string]uint64          // key names in use → claim id
	claims   uint64
	cleanups map[string]*cleanup // by name directory; see settle
}

// A cleanup counts the keys of a name whose caller moved on while their
// write was in flight: each is deleted in the background once the write
// returns, and until all are, the factory writes no new key for the name.
type cleanup struct {
	n    int
	done chan struct{} // closed when n drops to 0
}

// NewFactory returns a factory using cli, whose options are the defaults for
// every call. An invalid option, or a nil client, is reported by the first
// Acquire. The factory does not close cli.
func NewFactory(cli *clientv3.Client, opts ...Option) *Factory {
	cfg := backend.NewConfig(backendName, opts, checkOptions)
	if cli == nil {
		cfg.Fail(fmt.Errorf("%w: nil *clientv3.Client", lock.ErrInvalidOption))
	}
	host, _ := os.Hostname()
	var id [8]byte
	rand.Read(id[:])
	ctx, cancel := context.WithCancel(context.Background())
	return &Factory{
		cli: cli, cfg: cfg, process: fmt.Sprintf("%d@%s", os.Getpid(), host), id: hex.EncodeToString(id[:]),
		ctx: ctx, cancel: cancel,
		sessions: map[time.Duration]*session{}, private: map[*session]struct{}{}, watches: map[string]*watcher{},
		used: map[string]uint64{}, cleanups: map[string]*cleanup{},
	}
}

// Err returns the error of the factory's options (or a nil client), which
// every Acquire also returns; nil when the factory is usable. Check it at
// start-up.
func (f *Factory) Err() error { return f.cfg.Err }

func checkOptions(o *lock.Options) error { return checkTTL(o.TTL) }

// Acquire takes name. On contention it returns an error matching ErrLocked
// at once, or with WithWait waits in FIFO order until a permit is its own or
// ctx ends. The lock does not depend on ctx once acquired: it is held, and
// its lease renewed, until Release, a loss, or Close.
func (f *Factory) Acquire(ctx context.Context, name string, opts ...Option) (*Holder, error) {
	start := time.Now()
	o, err := f.cfg.Resolve(name, opts, checkOptions)
	// A read of the name's keys (which the caller may read): it fails when
	// etcd does not answer.
	probe := func(ctx context.Context) error {
		if _, err := f.cli.Get(ctx, prefixOf(&o)+backend.Escape(name)+"/", clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil {
			return fmt.Errorf("etcdlock: %w", err)
		}
		return nil
	}
	return backend.Take(ctx, backend.Call{Backend: backendName, Name: name, Locked: ErrLocked, Start: start, Probe: probe}, &o, err, func(ctx context.Context) (*Holder, time.Duration, error) {
		return f.take(ctx, name, &o)
	})
}

// WithLock runs fn while holding name; see lock.WithLock.
func (f *Factory) WithLock(ctx context.Context, name string, fn func(ctx context.Context) error, opts ...Option) error {
	return lock.WithLock(ctx, f.AsLocker(opts...), name, fn)
}

// AsLocker returns the factory as a lock.Locker whose every Acquire uses
// opts. Its holders are *Holder values.
func (f *Factory) AsLocker(opts ...Option) lock.Locker {
	return backend.Locker(&f.cfg, opts, f.Acquire)
}

// Keys. A name's directory is prefix + backend.Escape(name) + "/"; Escape
// leaves no '/' in a name, so no directory contains another's. Under it,
// each holder or waiter is <limit>/<factory id>-<n>: the limit in the key so
// that a holder with another limit is seen without reading values, and n the
// lowest number this factory is not using for the name; a shared holder's
// (WithShared) is <limit>/~<factory id>-<n>, so that the exclusive keys of
// a name are the range [<limit>/, <limit>/~) (factory ids are hex) and a
// transaction can ask whether any is there. Names are reused on
// purpose: etcd keeps every deleted key in its index until the next
// compaction, and a range over a name's directory (each acquire compares
// one) would otherwise walk one entry per acquire ever made.

// queue describes where one Acquire puts its key.
type queue struct {
	name   string
	prefix string // the factory's watched prefix
	dir    string // prefix + escaped name + "/"
	slots  string // dir + limit + "/": the holders and waiters of this limit
	keys   string // where its key goes: slots, or slots + "~" when shared
	shared bool   // WithShared: waits only for the exclusive keys before its own
	limit  int
	ttl    time.Duration
	renew  bool
	wait   bool
	opts   *lock.Options
}

func newQueue(name string, o *lock.Options) *queue {
	prefix := prefixOf(o)
	dir := prefix + backend.Escape(name) + "/"
	q := &queue{
		name: name, prefix: prefix, dir: dir, slots: dir + strconv.Itoa(o.Limit()) + "/", shared: o.Shared,
		limit: o.Limit(), ttl: ttlOf(o), renew: !o.NoAutoRenew, wait: o.Wait, opts: o,
	}
	q.keys = q.slots
	if q.shared {
		q.keys += sharedMark
	}
	return q
}

// sharedMark starts the last segment of a shared holder's key.
const sharedMark = "~"

// isShared reports whether key is a shared holder's.
func isShared(key string) bool {
	i := strings.LastIndexByte(key, '/')
	return strings.HasPrefix(key[i+1:], sharedMark)
}

// rangeEnd is the end of the range of keys that start with p.
func rangeEnd(p string) string {
	b := []byte(p)
	for i := len(b) - 1; i >= 0; i-- {
		if b[i] < 0xff {
			b[i]++
			return string(b[:i+1])
		}
	}
	return "\x00"
}

// limitOf reads the limit out of a key under dir.
func limitOf(dir, key string) (int, bool) {
	rest, ok := strings.CutPrefix(key, dir)
	if !ok {
		return 0, false
	}
	n, _, ok := strings.Cut(rest, "/")
	if !ok {
		return 0, false
	}
	v, err := strconv.Atoi(n)
	return v, err == nil && v > 0
}

// record is the value of a holder's key, for operators and Inspect.
type record struct {
	Owner    string            `json:"owner,omitempty"`
	Process  string            `json:"process"`
	Since    time.Time         `json:"since"`
	Metadata map[string]string `json:"metadata,omitempty"`
}

// A claim is the factory's use of one key name; names are handed out again
// once their claim is dropped.
type claim struct {
	key string
	id  uint64
}

func (f *Factory) claimKey(slots string) claim {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.claims++
	for n := 0; ; n++ {
		key := slots + f.id + "-" + strconv.Itoa(n)
		if _, used := f.used[key]; !used {
			f.used[key] = f.claims
			return claim{key, f.claims}
		}
	}
}

func (f *Factory) unclaim(c claim) {
	f.mu.Lock()
	if f.used[c.key] == c.id {
		delete(f.used, c.key)
	}
	f.mu.Unlock()
}

func (f *Factory) mismatch(q *queue, held int) error {
	return fmt.Errorf("etcdlock: %w: %q has limit %d, caller asked for %d", lock.ErrLimitMismatch, q.name, held, q.limit)
}

// errRequeue: the key of a waiter vanished (lease ended, operator) before it
// was granted, or the lease was found revoked; Acquire starts again with a
// new key.
var errRequeue = errors.New("etcdlock: queue entry vanished")

func (f *Factory) take(ctx context.Context, name string, o *lock.Options) (*Holder, time.Duration, error) {
	if err := ctx.Err(); err != nil {
		return nil, 0, err
	}
	q := newQueue(name, o)
	// A wait whose ctx ends mid-request, while the lease or the watch is
	// set up, or while queued, returns ctx's error: backend.Take tells, by
	// its probe, a wait that gave up on contention from one that gave up
	// on an outage.
	var waitStart time.Time
	waited := func() time.Duration {
		if waitStart.IsZero() {
			return 0
		}
		return time.Since(waitStart)
	}
	w, err := f.watch(ctx, q.prefix)
	if err != nil {
		return nil, 0, err
	}
	defer f.unrefWatch(w)
	for {
		s, err := f.session(ctx, q.ttl, q.renew)
		if err != nil {
			return nil, waited(), err
		}
		h, err := f.attempt(ctx, w, s, q, &waitStart)
		f.unrefSession(s)
		if errors.Is(err, errRequeue) {
			if err := ctx.Err(); err != nil {
				return nil, waited(), err // Finish probes: the lease may have ended with etcd
			}
			continue
		}
		return h, waited(), err
	}
}

// attempt puts one key for q on s's lease and returns once it holds a
// permit, or fails.
func (f *Factory) attempt(ctx context.Context, w *watcher, s *session, q *queue, waitStart *time.Time) (*Holder, error) {
	if err := f.settle(ctx, q.dir); err != nil {
		return nil, err
	}
	c := f.claimKey(q.keys)
	since := time.Now()
	val, _ := json.Marshal(record{Owner: q.opts.Owner, Process: f.process, Since: since, Metadata: q.opts.Metadata})
	var ws *waitState
	if q.wait {
		ws = w.addWaiter(q.slots)
		defer w.removeWaiter(q.slots, ws)
	}
	// unwritten ends an attempt whose key was not written.
	unwritten := func(err error) (*Holder, error) {
		w.untrack(c)
		f.unclaim(c)
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			// Revoked behind our back: its locks are lost (the watch tells
			// their holders); take a new lease.
			s.die(false)
			err = errRequeue
		}
		return nil, err
	}
	// commit runs one transaction that writes the key if cmps hold, and
	// checks in every case that the key name is not still in use by an
	// earlier lock of this factory that could not be deleted. Unless
	// implied, when cmps already say that the key is absent, that is
	// compared too.
	commit := func(implied bool, cmps []clientv3.Cmp, then, els []clientv3.Op) (*clientv3.TxnResponse, error) {
		for {
			w.track(c)
			if !implied {
				cmps = append([]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(c.key), "=", 0)}, cmps[:len(cmps):len(cmps)]...)
			}
			then := append([]clientv3.Op{clientv3.OpPut(c.key, string(val), clientv3.WithLease(s.id))}, then...)
			els := append(els[:len(els):len(els)], clientv3.OpGet(c.key, clientv3.WithKeysOnly()))
			resp, err := f.commit(ctx, s, q.dir, c, cmps, then, els)
			if errors.Is(err, rpctypes.ErrLeaseNotFound) {
				_, err = unwritten(err)
				return nil, err
			}
			if err != nil {
				w.untrack(c) // the claim stays with the cleanup
				return nil, fmt.Errorf("etcdlock: acquire: %w", err)
			}
			if resp.Succeeded || len(resp.Responses[len(els)-1].GetResponseRange().Kvs) == 0 {
				return resp, nil
			}
			// Left over (a lost lock of a dead lease): skip the name, and
			// check that the next one is absent.
			w.untrack(c)
			c = f.claimKey(q.keys)
			if implied {
				implied = false
			} else {
				cmps = cmps[1:]
			}
		}
	}

	// Keys of other limits, which make a mismatch: [below, slots) and
	// [above, end of dir).
	below, above := q.dir, rangeEnd(q.slots)
	others := []clientv3.Cmp{
		clientv3.Compare(clientv3.CreateRevision(below).WithRange(q.slots), "=", 0),
		clientv3.Compare(clientv3.CreateRevision(above).WithRange(rangeEnd(q.dir)), "=", 0),
	}
	othersOps := []clientv3.Op{
		clientv3.OpGet(below, clientv3.WithRange(q.slots), clientv3.WithKeysOnly(), clientv3.WithLimit(1)),
		clientv3.OpGet(above, clientv3.WithRange(rangeEnd(q.dir)), clientv3.WithKeysOnly(), clientv3.WithLimit(1)),
	}
	mismatched := func(resp *clientv3.TxnResponse) error {
		for _, r := range resp.Responses[:2] {
			if kvs := r.GetResponseRange().Kvs; len(kvs) > 0 {
				n, _ := limitOf(q.dir, string(kvs[0].Key))
				return f.mismatch(q, n)
			}
		}
		return nil
	}
	if !q.wait && q.shared {
		// Write only if no exclusive key is there, holding or waiting
		// (writer preference), nor a key of another limit.
		cmps := append([]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(q.slots).WithRange(q.slots+sharedMark), "=", 0)}, others...)
		resp, err := commit(false, cmps, nil, othersOps)
		if err != nil {
			return nil, err
		}
		if resp.Succeeded {
			return f.admit(ctx, w, s, q, c, resp.Header.Revision, since)
		}
		if err := mismatched(resp); err != nil {
			return unwritten(err)
		}
		return unwritten(ErrLocked)
	}
	if !q.wait {
		// Write only if the name is free, or every key seen is still there
		// and a permit was free: then the new key is among the first n. No
		// write at all when the name is taken. Either condition also says
		// that the key is absent (it was, when the keys were seen).
		cmp := clientv3.Compare(clientv3.CreateRevision(q.dir).WithPrefix(), "=", 0)
		first := clientv3.OpGet(q.dir, clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithLimit(1))
		for {
			resp, err := commit(true, []clientv3.Cmp{cmp}, nil, []clientv3.Op{first})
			if err != nil {
				return nil, err
			}
			if resp.Succeeded {
				return f.admit(ctx, w, s, q, c, resp.Header.Revision, since)
			}
			rr := resp.Responses[0].GetResponseRange()
			if rr.Count > 0 {
				if n, _ := limitOf(q.dir, string(rr.Kvs[0].Key)); n != q.limit {
					return unwritten(f.mismatch(q, n))
				}
				if rr.Count >= int64(q.limit) {
					return unwritten(ErrLocked)
				}
			}
			if err := ctx.Err(); err != nil {
				return unwritten(err)
			}
			cmp = clientv3.Compare(clientv3.ModRevision(q.dir).WithPrefix(), "<", resp.Header.Revision+1)
		}
	}

	// Queue: the key goes in unless keys of another limit are there, and the
	// keys ahead of it are read in the same transaction. A shared key
	// waits only for the exclusive keys ahead of it, an exclusive one for
	// every key: the revision order is the order of service, and a
	// reader that comes after a waiting writer waits behind it.
	behind := func(key string) bool { return !q.shared || !isShared(key) }
	all := clientv3.OpGet(q.slots, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	var resp *clientv3.TxnResponse
	for {
		var err error
		resp, err = commit(false, others, []clientv3.Op{all}, othersOps)
		if err != nil {
			return nil, err
		}
		if resp.Succeeded {
			break
		}
		if err := mismatched(resp); err != nil {
			return unwritten(err)
		}
		if err := ctx.Err(); err != nil {
			return unwritten(err)
		}
	}
	rev := resp.Header.Revision
	ahead := map[string]bool{}
	for _, kv := range resp.Responses[1].GetResponseRange().Kvs {
		if kv.CreateRevision < rev && behind(string(kv.Key)) {
			ahead[string(kv.Key)] = true
		}
	}
	if len(ahead) >= q.limit && !q.renew {
		// A lease that only Extend renews must still live through the wait.
		defer s.renewWhile()()
	}
	base := rev // events at or below base are already reflected in ahead
	for len(ahead) >= q.limit {
		if waitStart.IsZero() {
			*waitStart = time.Now()
		}
		select {
		case <-ws.ch:
		case <-ctx.Done():
			// Held as far as the watch told; whether etcd still answers,
			// the probe says (see backend.Take).
			f.abandon(w, s, c, rev)
			return nil, ctx.Err()
		case <-f.ctx.Done():
			f.abandon(w, s, c, rev)
			return nil, lock.ErrClosed
		}
		evs, resync := ws.drain()
		if resync {
			g, err := f.cli.Get(ctx, q.slots, clientv3.WithPrefix(), clientv3.WithKeysOnly())
			if err != nil {
				f.abandon(w, s, c, rev)
				if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
					return nil, ctx.Err() // the probe decides
				}
				return nil, fmt.Errorf("etcdlock: acquire: %w", err) // a failure, not contention
			}
			base = g.Header.Revision
			clear(ahead)
			mine := false
			for _, kv := range g.Kvs {
				switch {
				case string(kv.Key) == c.key && kv.CreateRevision == rev:
					mine = true
				case kv.CreateRevision < rev && behind(string(kv.Key)):
					ahead[string(kv.Key)] = true
				}
			}
			if !mine {
				return unwritten(errRequeue)
			}
		}
		for _, ev := range evs {
			switch {
			case ev.rev <= base:
			case ev.key == c.key:
				return unwritten(errRequeue)
			default:
				delete(ahead, ev.key)
			}
		}
	}
	return f.admit(ctx, w, s, q, c, rev, since)
}

// commit runs one transaction that may write the key of c, under dir. The
// write runs on a context of its own, so that its outcome is known even if
// ctx ends first: the caller then gets ctx's error at once. When the key was
// written for nobody, or may have been, it is deleted in the background, as
// a cleanup of dir, so that a caller retrying on short deadlines waits for
// it (settle) instead of piling up writes.
func (f *Factory) commit(ctx context.Context, s *session, dir string, c claim, cmps []clientv3.Cmp, then, els []clientv3.Op) (*clientv3.TxnResponse, error) {
	run := func(ctx context.Context) (*clientv3.TxnResponse, error) {
		return f.cli.Txn(ctx).If(cmps...).Then(then...).Else(els...).Commit()
	}
	if ctx.Done() == nil {
		resp, err := run(ctx)
		if err != nil && !rejected(err) {
			f.pend(dir)
			if !f.spawn(func() { defer f.unpend(dir); f.remove(s, c, 0) }) {
				f.unpend(dir)
			}
		}
		return resp, err
	}
	type result struct {
		resp *clientv3.TxnResponse
		err  error
	}
	var (
		mu   sync.Mutex
		left bool
		ch   = make(chan result, 1)
	)
	if !f.spawn(func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), opTimeout)
		resp, err := run(dctx)
		cancel()
		unknown := err != nil && !rejected(err)
		mu.Lock()
		gone := left // then the caller made it a cleanup
		if !gone {
			if unknown {
				f.pend(dir) // before the caller can try again
			}
			ch <- result{resp, err} // buffered; under mu so the caller cannot leave in between
		}
		mu.Unlock()
		if gone || unknown {
			defer f.unpend(dir)
		}
		switch {
		case err != nil && !rejected(err):
			f.remove(s, c, 0)
		case !gone: // the caller has the outcome
		case err != nil:
			f.unclaim(c)
		case resp.Succeeded:
			f.remove(s, c, resp.Header.Revision)
		default:
			f.unclaim(c)
		}
	}) {
		return nil, lock.ErrClosed
	}
	select {
	case r := <-ch:
		return r.resp, r.err
	case <-ctx.Done():
	}
	mu.Lock()
	defer mu.Unlock()
	select {
	case r := <-ch:
		return r.resp, r.err
	default:
		left = true
		f.pend(dir)
		return nil, ctx.Err()
	}
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

// remove deletes the key of c if it is still the one created at rev, and
// drops the claim. rev 0 means the outcome of the write is unknown: the key
// is deleted whatever its revision, and again while the session lives, in
// case the write is applied late. On failure the session retries.
func (f *Factory) remove(s *session, c claim, rev int64) {
	ctx, cancel := backend.ReleaseContext(context.Background())
	defer cancel()
	var err error
	if rev == 0 {
		_, err = f.cli.Delete(ctx, c.key)
	} else {
		_, err = f.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(c.key), "=", rev)).Then(clientv3.OpDelete(c.key)).Commit()
	}
	if err != nil || rev == 0 {
		s.addOrphan(c, rev)
		return
	}
	f.unclaim(c)
}

// abandon gives up a waiter's key before returning, so that the permit it
// may just have been handed passes on at once.
func (f *Factory) abandon(w *watcher, s *session, c claim, rev int64) {
	w.untrack(c)
	f.remove(s, c, rev)
}

// admit turns the key into a holder.
func (f *Factory) admit(ctx context.Context, w *watcher, s *session, q *queue, c claim, rev int64, since time.Time) (*Holder, error) {
	h := &Holder{
		f: f, w: w, s: s, name: q.name, key: c.key, claim: c, token: uint64(rev), opts: q.opts,
		state: backend.NewState(), ctx: context.WithoutCancel(ctx), since: since,
	}
	f.refWatch(w)
	f.refSession(s)
	if !s.addHolder(h) {
		// The lease was declared lost while the key went in.
		h.detach()
		f.abandon(w, s, c, rev)
		return nil, errRequeue
	}
	for {
		switch w.hold(c, h) {
		case held:
			h.state.Bound(h.opts, ErrLockLost, nil, h.endHold)
			return h, nil
		case unverified:
			gen := w.generation()
			rctx, cancel := backend.ReleaseContext(ctx)
			resp, err := f.cli.Get(rctx, c.key, clientv3.WithKeysOnly())
			cancel()
			if err == nil && len(resp.Kvs) == 1 && resp.Kvs[0].CreateRevision == rev {
				w.verified(c, gen)
				continue
			}
		}
		// Deleted already (operator, lease ended), or cannot tell: this
		// lock was never safe to use.
		s.removeHolder(h)
		h.detach()
		f.abandon(w, s, c, rev)
		return nil, errRequeue
	}
}

// spawn runs fn in a goroutine that Close waits for; it reports false, and
// does not run fn, once the factory is closed.
func (f *Factory) spawn(fn func()) bool {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return false
	}
	f.wg.Add(1)
	f.mu.Unlock()
	go func() {
		defer f.wg.Done()
		fn()
	}()
	return true
}

// Close revokes the factory's leases, which frees every lock it holds (their
// holders' Err matches ErrLockLost and lock.ErrClosed), makes waiters and later Acquire calls fail with
// lock.ErrClosed, and stops its background work. It does not close the
// client.
func (f *Factory) Close() error {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return nil
	}
	f.closed = true
	var sessions []*session
	for _, s := range f.sessions {
		sessions = append(sessions, s)
	}
	for s := range f.private {
		sessions = append(sessions, s)
	}
	var watches []*watcher
	for _, w := range f.watches {
		watches = append(watches, w)
	}
	clear(f.sessions)
	clear(f.private)
	clear(f.watches)
	f.mu.Unlock()

	f.cancel()
	var errs []error
	for _, s := range sessions {
		<-s.ready
		if s.err == nil {
			errs = append(errs, s.end())
		}
	}
	for _, w := range watches {
		w.cancel()
	}
	f.wg.Wait()
	return errors.Join(errs...)
}
