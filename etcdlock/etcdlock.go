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
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

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
	watches  map[string]*watcher        // watches of its own keys, by scope
	named    map[string]int             // watches of one name, per key prefix
	used     map[string]uint64          // key names in use → claim id
	claims   uint64
	cleanups map[string]*cleanup // by name directory; see settle
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
		named: map[string]int{}, used: map[string]uint64{}, cleanups: map[string]*cleanup{},
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

// errRequeue: the key of a waiter vanished (lease ended, operator) before it
// was granted, or the lease was found revoked; Acquire starts again with a
// new key.
var errRequeue = errors.New("etcdlock: queue entry vanished")

// take runs attempts, each a key on a live lease, until one holds a permit
// or fails other than by its key vanishing. A wait whose ctx ends
// mid-request, while the lease or the watch is set up, or while queued,
// returns ctx's error: backend.Take tells, by its probe, a wait that gave
// up on contention from one that gave up on an outage.
func (f *Factory) take(ctx context.Context, name string, o *lock.Options) (*Holder, time.Duration, error) {
	if err := ctx.Err(); err != nil {
		return nil, 0, err
	}
	q := newQueue(name, o)
	w, err := f.watch(ctx, q)
	if err != nil {
		return nil, 0, err
	}
	defer f.unrefWatch(w)
	var blocked time.Time // when the first attempt had to wait
	waited := func() time.Duration {
		if blocked.IsZero() {
			return 0
		}
		return time.Since(blocked)
	}
	for {
		s, err := f.session(ctx, q.ttl, q.renew)
		if err != nil {
			return nil, waited(), err
		}
		a := &attempt{f: f, ctx: ctx, q: q, w: w, s: s}
		h, err := a.try()
		f.unrefSession(s)
		if blocked.IsZero() {
			blocked = a.blocked
		}
		if errors.Is(err, errRequeue) {
			if err := ctx.Err(); err != nil {
				return nil, waited(), err // Take probes: the lease may have ended with etcd
			}
			continue
		}
		return h, waited(), err
	}
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
	prefix string // the factory's key prefix
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

// mismatch is the error of a caller whose limit is not the holders'.
func (q *queue) mismatch(held int) error {
	return fmt.Errorf("etcdlock: %w: %q has limit %d, caller asked for %d", lock.ErrLimitMismatch, q.name, held, q.limit)
}

// otherLimits compares that no key of another limit than q's is under the
// name, the ranges [dir, slots) and [end of slots, end of dir), and reads
// the first of each when one is: the transaction's first two responses,
// which mismatched reads.
func (q *queue) otherLimits() ([]clientv3.Cmp, []clientv3.Op) {
	below, above := q.dir, rangeEnd(q.slots)
	return []clientv3.Cmp{
			clientv3.Compare(clientv3.CreateRevision(below).WithRange(q.slots), "=", 0),
			clientv3.Compare(clientv3.CreateRevision(above).WithRange(rangeEnd(q.dir)), "=", 0),
		}, []clientv3.Op{
			clientv3.OpGet(below, clientv3.WithRange(q.slots), clientv3.WithKeysOnly(), clientv3.WithLimit(1)),
			clientv3.OpGet(above, clientv3.WithRange(rangeEnd(q.dir)), clientv3.WithKeysOnly(), clientv3.WithLimit(1)),
		}
}

// mismatched is the error of a transaction that failed on otherLimits'
// comparisons, or nil.
func (q *queue) mismatched(resp *clientv3.TxnResponse) error {
	for _, r := range resp.Responses[:2] {
		if kvs := r.GetResponseRange().Kvs; len(kvs) > 0 {
			n, _ := limitOf(q.dir, string(kvs[0].Key))
			return q.mismatch(n)
		}
	}
	return nil
}

// window reads the keys that a key of q waits for, newest first, at most
// n: a shared key waits only for the exclusive keys, the range [slots,
// slots~), an exclusive one for every key. The revision order is the order
// of service, and a reader that comes after a waiting writer waits behind
// it.
func (q *queue) window(n int, opts ...clientv3.OpOption) clientv3.Op {
	end := rangeEnd(q.slots)
	if q.shared {
		end = q.slots + sharedMark
	}
	return clientv3.OpGet(q.slots, append([]clientv3.OpOption{clientv3.WithRange(end), clientv3.WithKeysOnly(),
		clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortDescend), clientv3.WithLimit(int64(n))}, opts...)...)
}

// spawn runs fn in a goroutine that Close waits for; it reports false, and
// does not run fn, once the factory is closed.
func (f *Factory) spawn(fn func()) bool {
	if !f.enter() {
		return false
	}
	go func() {
		defer f.wg.Done()
		fn()
	}()
	return true
}

// enter counts work in f.wg, which Close waits for, unless the factory is
// closed; the caller ends it with f.wg.Done.
func (f *Factory) enter() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return false
	}
	f.wg.Add(1)
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
	clear(f.named)
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
