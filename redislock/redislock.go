// Package redislock is the Redis backend of github.com/ubgo/lock: named
// mutexes, shared locks and semaphores kept in Redis (standalone, Sentinel
// or Cluster, through a go-redis client), with fencing tokens that grow,
// leases renewed in the background, and waiters that queue in Redis and are
// handed the name by the release.
//
// A holder that cannot renew reports the lock lost (Done, Err, WithLock's
// context) before Redis can free it. Redis replicates asynchronously, so a
// failover can lose a lock: pass Holder.Token to the resource where that
// matters. How it works, what is stored where, how fast a loss is noticed
// and when exclusion holds:
// https://github.com/ubgo/lock/blob/main/docs/guides/redislock.md
package redislock

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"net"
	"os"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/ubgo/lock"
	"github.com/ubgo/lock/backend"
)

// Errors, matching the root sentinels with errors.Is.
var (
	ErrLocked   = fmt.Errorf("redislock: %w", lock.ErrLocked)
	ErrLockLost = fmt.Errorf("redislock: %w", lock.ErrLockLost)
)

const backendName = "redislock"

// tokenRetention is how long the token counter outlives the last acquire.
// Tokens never go below the server clock in microseconds, so the counter
// only matters for acquisitions within the same microsecond or while the
// server clock steps back; it need not live forever.
const tokenRetention = 24 * time.Hour

// maxPoll bounds the wait between two attempts of a waiter that receives no
// notification, for a notification lost while pub/sub reconnects.
const maxPoll = 5 * time.Second

// Client is the part of a go-redis client the factory uses: scripts,
// pipelines and pub/sub. *redis.Client, *redis.ClusterClient, *redis.Ring
// and every redis.UniversalClient implement it.
type Client interface {
	redis.Scripter
	Pipeline() redis.Pipeliner
	Subscribe(ctx context.Context, channels ...string) *redis.PubSub
}

var (
	_ Client = (*redis.Client)(nil)
	_ Client = (*redis.ClusterClient)(nil)
	_ Client = (*redis.Ring)(nil)
	_ Client = redis.UniversalClient(nil)
)

// Factory hands out locks kept in Redis. Factories on the same server and
// key prefix contend with each other, whichever process they are in.
// Create one per client and share it: it runs one renewal loop and one
// pub/sub connection for all its locks. Close it when done; without Close
// its goroutines still stop once nothing is held or waited for.
type Factory struct {
	c     Client
	cfg   backend.Config
	owner string // pid@host, the default for WithOwner
	// together: every key seems to live on one server (a *redis.Client,
	// not a cluster or a ring client), so one script may renew many names.
	// Cleared if the server says otherwise (a plain client on a cluster).
	together atomic.Bool

	rn  renewer
	hub hub
	wg  sync.WaitGroup

	mu      sync.Mutex
	closed  bool
	closing chan struct{}
}

// NewFactory returns a factory on client whose options are the defaults for
// every call. A nil client or an invalid option is reported by the first
// Acquire.
func NewFactory(client Client, opts ...Option) *Factory {
	f := &Factory{c: client, cfg: backend.NewConfig(backendName, opts, checkOptions), closing: make(chan struct{}), owner: defaultOwner()}
	if isNil(client) {
		f.cfg.Fail(fmt.Errorf("%w: nil Redis client", lock.ErrInvalidOption))
	}
	if f.replicaAck() > 0 {
		switch client.(type) {
		case *redis.Client, *redis.ClusterClient:
		default:
			f.cfg.Fail(fmt.Errorf("%w: WithReplicaAck needs a *redis.Client or *redis.ClusterClient, not %T", lock.ErrInvalidOption, client))
		}
	}
	f.rn.f = f
	f.hub.f = f
	f.hub.own = cmp.Or(f.cfg.Options.KeyPrefix, DefaultKeyPrefix) + "wake:" + semID(newID())
	_, together := client.(*redis.Client)
	f.together.Store(together)
	return f
}

// Err returns the error of the factory's options (or a nil client), which
// every Acquire also returns; nil when the factory is usable. Check it at
// start-up.
func (f *Factory) Err() error { return f.cfg.Err }

func isNil(c Client) bool {
	if c == nil {
		return true
	}
	v := reflect.ValueOf(c)
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface, reflect.Map, reflect.Slice, reflect.Func, reflect.Chan:
		return v.IsNil()
	}
	return false
}

func defaultOwner() string {
	host, _ := os.Hostname()
	return strconv.Itoa(os.Getpid()) + "@" + host
}

func checkTTL(d time.Duration) error {
	if d != 0 && d < MinTTL {
		return fmt.Errorf("%w: WithTTL(%v) is below the minimum of %v", lock.ErrInvalidOption, d, MinTTL)
	}
	return nil
}

// Acquire takes name. On contention it returns an error matching ErrLocked
// at once, or with WithWait waits until the lock is free or ctx ends. The
// lease renews in the background unless WithAutoRenew(false) is given;
// then call Extend.
func (f *Factory) Acquire(ctx context.Context, name string, opts ...Option) (*Holder, error) {
	start := time.Now()
	o, err := f.resolve(name, opts)
	return backend.Take(ctx, backend.Call{Backend: backendName, Name: name, Locked: ErrLocked, Start: start, Probe: f.probe}, &o, err, func(ctx context.Context) (*Holder, time.Duration, error) {
		return f.take(ctx, name, &o, !o.NoAutoRenew)
	})
}

// WithLock runs fn while holding name; see lock.WithLock. fn's context is
// cancelled if the lock is lost.
func (f *Factory) WithLock(ctx context.Context, name string, fn func(ctx context.Context) error, opts ...Option) error {
	return lock.WithLock(ctx, f.AsLocker(opts...), name, fn)
}

// AsLocker returns the factory as a lock.Locker whose every Acquire uses
// opts. Its holders are *Holder values (so lock.Extender works on them).
func (f *Factory) AsLocker(opts ...Option) lock.Locker {
	return backend.Locker(&f.cfg, opts, f.Acquire)
}

// keys are the Redis keys and channel of one name, all tagged with
// {<escaped name>} so that they share a cluster slot. tomb is the prefix
// of its tombstone keys, one per given-up id (see tombOf); rwait marks
// that readers wait for the name (see lua/shared_acquire.lua).
type keys struct {
	lock, token, slots, permits, channel, tomb, rwait string
}

func keysFor(prefix, name string) keys {
	if prefix == "" {
		prefix = DefaultKeyPrefix
	}
	return keysOfEscaped(prefix, backend.Escape(name))
}

// keysOfEscaped is keysFor for a name known by its escaped form (List).
func keysOfEscaped(prefix, esc string) keys {
	return keysOfBase(prefix + "{" + esc + "}:")
}

// keysOfBase is keysFor for the common start of a name's keys,
// "<prefix>{<escaped name>}:" (a grant names the lock key).
func keysOfBase(base string) keys {
	return keys{
		lock: base + "lock", token: base + "token", slots: base + "slots",
		permits: base + "permits", channel: base + "released", tomb: base + "tomb:",
		rwait: base + "rwait",
	}
}

// list is the keys every semaphore script takes.
func (k keys) list() []string { return []string{k.lock, k.token, k.slots, k.permits} }

// tombOf is the tombstone key of the acquisition with this id: written when
// the id is released or its failed attempt cleaned up, it stops the id's
// acquire script from taking the name if it runs only afterwards (a request
// delayed on its way past the client's timeout, or a copy of one the client
// retried).
func (k keys) tombOf(id string) string { return k.tomb + semID(id) }

// lease holds what an acquisition needs of its call's options.
type lease struct {
	ttl    time.Duration
	margin time.Duration // the holder gives up this long before the server's expiry
	limit  int
	meta   string // owner and metadata as stored for Inspect
	shared bool   // WithShared: a reader, kept like a semaphore permit
	wait   bool   // WithWait
}

// permit reports whether the holder is a member of the name's slots (a
// semaphore permit or a reader) rather than the mutex's value.
func (ls lease) permit() bool { return ls.limit > 1 || ls.shared }

// resolve applies a call's options over the factory's.
func (f *Factory) resolve(name string, opts []Option) (lock.Options, error) {
	return f.cfg.Resolve(name, opts, checkOptions)
}

func checkOptions(o *lock.Options) error {
	if err := checkTTL(o.TTL); err != nil {
		return err
	}
	return checkPrefix(o.KeyPrefix)
}

// checkPrefix refuses a prefix whose first '{' is followed at once by '}':
// Redis Cluster hashes such a key whole, not by the name's tag after it,
// so the keys of one name would fall in different slots (CROSSSLOT).
func checkPrefix(prefix string) error {
	if i := strings.IndexByte(prefix, '{'); i >= 0 && strings.HasPrefix(prefix[i:], "{}") {
		return fmt.Errorf("%w: WithKeyPrefix(%q): an empty hash tag {} first in the key would spread a name's keys over cluster slots", lock.ErrInvalidOption, prefix)
	}
	return nil
}

// leaseOf turns resolved options into the lease of one acquisition.
func (f *Factory) leaseOf(o *lock.Options) lease {
	ttl := cmp.Or(o.TTL, DefaultTTL).Truncate(time.Millisecond) // what Redis stores
	// A string and a map of strings always marshal.
	m, _ := json.Marshal(meta{Owner: cmp.Or(o.Owner, f.owner), Metadata: o.Metadata})
	return lease{ttl: ttl, margin: ttl/10 + 2*time.Millisecond, limit: o.Limit(), meta: string(m), shared: o.Shared, wait: o.Wait}
}

// probe fails when Redis does not answer (the Client interface has no
// PING; SCRIPT EXISTS is as cheap).
func (f *Factory) probe(ctx context.Context) error {
	if err := f.c.ScriptExists(ctx, mutexAcquire.Hash()).Err(); err != nil {
		return fmt.Errorf("redislock: %w", err)
	}
	return nil
}

// attempt is the outcome of one run of the acquire script.
type attempt struct {
	status int // 1 acquired, 0 locked, -1 limit mismatch
	token  uint64
	pttl   time.Duration
	limit  int
	sent   time.Time
}

// take runs the acquire script until it gets the lock, or with WithWait
// until ctx ends (see wait.go for how a waiter is woken). Every attempt of
// one call uses the same id.
func (f *Factory) take(ctx context.Context, name string, o *lock.Options, renew bool) (*Holder, time.Duration, error) {
	if f.isClosed() {
		return nil, 0, lock.ErrClosed
	}
	k := keysFor(o.KeyPrefix, name)
	ls := f.leaseOf(o)
	id := newID()
	var w *waiter
	if o.Wait && !ls.permit() {
		// In the hub before the first look, so that a grant is not missed.
		w = f.hub.addMutex(k.channel, id)
		w.leave = func() { f.leaveQueue(ctx, k, id, ls, w) }
		defer w.Close()
	}
	// Others in this process wait already for the semaphore: queue behind
	// them rather than overtake them. The release that frees a permit
	// wakes the first of them, and each in turn.
	queued := o.Wait && ls.permit() && f.hub.waiting(k.channel) > 0
	return backend.Wait(ctx, backend.Waiting{
		Wait: o.Wait, Locked: ErrLocked, Closed: f.closing,
		// A release grants a mutex or wakes a semaphore's first waiter;
		// every look that finds the name held bounds the next by a lease
		// (the attempt's hint), so a holder or granted waiter that died is
		// noticed within one; maxPoll caps it.
		MinPoll: maxPoll, MaxPoll: maxPoll,
		Queued: queued,
		Subscribe: func() (backend.Subscription, error) {
			if w != nil {
				w.skip = w.joined
				return w, nil
			}
			var ahead int
			w, ahead = f.hub.join(k.channel)
			if queued && ahead == 0 {
				signal(w) // those it queued behind are gone: its turn
			}
			return w, nil
		},
	}, func() (*Holder, time.Duration, error) {
		if err := ctx.Err(); err != nil {
			return nil, 0, err
		}
		a, err := f.look(ctx, k, id, ls, w)
		switch {
		case err != nil:
			return nil, 0, err
		case a.status == 0:
			return nil, a.pttl, ErrLocked
		case a.status < 0:
			return nil, 0, fmt.Errorf("redislock: %w: %q is held with limit %d, caller asked for %d", lock.ErrLimitMismatch, name, a.limit, ls.limit)
		}
		h := f.newHolder(ctx, name, k, id, ls, o, a, renew)
		if !f.rn.add(h) {
			h.Release()
			return nil, 0, lock.ErrClosed
		}
		if f.replicaAck() > 0 {
			if err := f.confirm(ctx, h); err != nil {
				h.Release()
				return nil, 0, err
			}
		}
		if w != nil {
			w.acquired = true
		}
		return h, 0, nil
	})
}

// unreachable has a cluster client reload its map of the cluster after a
// call failed on the network: go-redis otherwise keeps sending a failed
// master's slots to it until its periodic reload (a minute by default;
// go-redis issue #3979), long after a replica took over.
func (f *Factory) unreachable(err error) {
	var ne net.Error
	if cc, ok := f.c.(*redis.ClusterClient); ok && errors.As(err, &ne) {
		cc.ReloadState(context.Background())
	}
}

// try runs the acquire script once. A mutex waiter passes its factory's
// channel ch to join the name's queue.
func (f *Factory) try(ctx context.Context, k keys, id string, ls lease, ch string) (attempt, error) {
	a := attempt{sent: time.Now()}
	kl := []string{k.lock, k.token, k.slots, k.permits, k.tombOf(id)}
	var cmd *redis.Cmd
	switch {
	case ls.shared:
		wait := "0"
		if ls.wait {
			wait = "1"
		}
		cmd = sharedAcquire.Run(ctx, f.c, append(kl, k.rwait), semID(id), ls.ttl.Milliseconds(), ls.meta, tokenRetention.Milliseconds(), wait)
	case ls.limit == 1:
		cmd = mutexAcquire.Run(ctx, f.c, kl, id, ls.ttl.Milliseconds(), ls.meta, tokenRetention.Milliseconds(), ch)
	default:
		cmd = semAcquire.Run(ctx, f.c, kl, semID(id), ls.ttl.Milliseconds(), ls.limit, ls.meta, tokenRetention.Milliseconds())
	}
	res, err := cmd.Result()
	if err != nil {
		f.unreachable(err)
		f.abandon(ctx, k, id, ls)
		return a, fmt.Errorf("redislock: acquire: %w", err)
	}
	arr, ok := res.([]any)
	if !ok { // acquired: the reply is the token
		tok, err := toUint(res)
		if err != nil || tok == 0 {
			return a, fmt.Errorf("redislock: acquire: bad reply %v", res)
		}
		a.status, a.token = 1, tok
		return a, nil
	}
	if len(arr) < 2 {
		return a, fmt.Errorf("redislock: acquire: unexpected reply %v", res)
	}
	st, _ := toInt(arr[0])
	a.status = int(st)
	switch a.status {
	case 0:
		ms, _ := toInt(arr[1])
		a.pttl = time.Duration(ms) * time.Millisecond
		if ms < 0 {
			// A key without expiry (an operator's SET): when it ends is
			// unknown, so poll at the longest interval.
			a.pttl = maxPoll
		}
	case -1:
		lim, _ := toInt(arr[1])
		a.limit = int(lim)
	case -2: // the id has a tombstone: not from a live attempt
		return a, fmt.Errorf("redislock: acquire: attempt already given up")
	default:
		return a, fmt.Errorf("redislock: acquire: unexpected reply %v", res)
	}
	return a, nil
}

// abandon cleans up after an attempt that failed without a reply: the
// script may have run, or run in part, and its reply been lost, or it may
// still be on its way. So it releases the lock by the attempt's id (unique,
// so this cannot touch anyone else's), which also writes the id's
// tombstone. It runs in the background, bounded by its own timeout: the
// caller's ctx may be over, and a server that does not answer would
// otherwise keep the caller waiting for that long. Close waits for it.
func (f *Factory) abandon(ctx context.Context, k keys, id string, ls lease) {
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
		s, keys, args := f.releaseCall(k, id, ls)
		s.Run(cctx, f.c, keys, args...)
	}()
}

// releaseCall is the script, keys and arguments that release the lock,
// reader or permit with this id (a mutex, or a name its last reader
// leaves, to its first waiter) and write its tombstone, for one TTL.
func (f *Factory) releaseCall(k keys, id string, ls lease) (*redis.Script, []string, []any) {
	tomb, ttl := k.tombOf(id), ls.ttl.Milliseconds()
	if ls.limit == 1 {
		heard := "0"
		if f.together.Load() {
			heard = "1"
		}
		mode := ""
		if ls.shared {
			id, mode = semID(id), "s"
		}
		return mutexRelease, []string{k.lock, tomb, k.token, k.slots, k.permits, k.rwait}, []any{id, ttl, heard, time.Now().UnixMilli(), tokenRetention.Milliseconds(), k.channel, mode}
	}
	return semRelease, append(k.list(), tomb), []any{semID(id), k.channel, ttl}
}

// extendCall is the script, keys and arguments that extend a holder of
// lease ls by its TTL.
func extendCall(k keys, id string, ls lease) (*redis.Script, []string, []any) {
	if !ls.permit() {
		return mutexExtend, []string{k.lock}, []any{id, ls.ttl.Milliseconds()}
	}
	return semExtend, k.list(), []any{semID(id), ls.ttl.Milliseconds()}
}

func toInt(v any) (int64, error) {
	switch x := v.(type) {
	case int64:
		return x, nil
	case string:
		return strconv.ParseInt(x, 10, 64)
	}
	return 0, fmt.Errorf("unexpected %T", v)
}

func toUint(v any) (uint64, error) {
	switch x := v.(type) {
	case int64:
		if x < 0 {
			return 0, fmt.Errorf("negative")
		}
		return uint64(x), nil
	case string:
		return strconv.ParseUint(x, 10, 64)
	}
	return 0, fmt.Errorf("unexpected %T", v)
}

// newID returns a random id, unique per acquisition, in the form a mutex
// value starts with: 32 hex digits and a ':'.
func newID() string {
	var b [16]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:]) + ":"
}

// semID is id as a semaphore permit id, without the ':'.
func semID(id string) string { return id[:len(id)-1] }

// meta is what is stored with a holder for Inspect.
type meta struct {
	Owner    string            `json:"owner,omitempty"`
	Metadata map[string]string `json:"metadata,omitempty"`
}

func (f *Factory) isClosed() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.closed
}

// Inspect reports the current holders of name under the factory's key
// prefix: for each, its token, owner, metadata, when it was acquired (server
// clock) and when its lease ends.
func (f *Factory) Inspect(ctx context.Context, name string) (lock.Info, error) {
	o, err := f.resolve(name, nil)
	if err != nil {
		return lock.Info{}, err
	}
	k := keysFor(o.KeyPrefix, name)
	res, err := inspectScript.Run(ctx, f.c, k.list()).Slice()
	if err != nil {
		return lock.Info{Name: name}, fmt.Errorf("redislock: inspect: %w", err)
	}
	return parseInspect(name, res, time.Now()), nil
}

// mutexReply reports whether an inspect reply is a mutex's holder (read
// from the lock key), not permits or readers (read from slots).
func mutexReply(res []any) bool {
	lim, _ := toInt(res[0])
	return lim == 1 && len(res) == 3
}

// parseInspect reads the inspect script's reply.
func parseInspect(name string, res []any, now time.Time) lock.Info {
	info := lock.Info{Name: name}
	if len(res) == 0 {
		return info
	}
	lim, _ := toInt(res[0])
	info.Limit = int(lim)
	if mutexReply(res) {
		v, _ := res[1].(string)
		ms, _ := toInt(res[2])
		// The waiters queued for the mutex follow the holder, one line
		// each (see lua/mutex_acquire.lua).
		v, queue, _ := strings.Cut(v, "\n")
		if queue != "" {
			info.Waiting = strings.Count(queue, "\n") + 1
		}
		parts := strings.SplitN(v, ":", 4)
		if len(parts) == 4 {
			info.Holders = append(info.Holders, holderInfo(parts[1], parts[2], parts[3], ms, now))
		}
		return info
	}
	if (len(res)-1)%3 == 1 {
		// A writer waits for the readers: the placeholder's queue.
		v, _ := res[len(res)-1].(string)
		info.Waiting = strings.Count(v, "\n")
	}
	for i := 1; i+2 < len(res); i += 3 {
		v, _ := res[i+1].(string)
		ms, _ := toInt(res[i+2])
		parts := strings.SplitN(v, ":", 3)
		if len(parts) == 3 {
			info.Holders = append(info.Holders, holderInfo(parts[0], parts[1], parts[2], ms, now))
		}
	}
	sort.Slice(info.Holders, func(i, j int) bool { return info.Holders[i].Token < info.Holders[j].Token })
	return info
}

// List yields the held names under the factory's key prefix that start
// with prefix, with their holders as Inspect reports them. It SCANs for
// the names' lock keys (<key prefix>{<escaped name>}:lock, and :slots for
// a semaphore), lock.ListPageSize at a time, on every master of a
// cluster or shard of a ring, and reads each page's holders in one
// pipeline. The order is SCAN's, not sorted, and SCAN may return a key
// twice while Redis resizes its table, so a name may, rarely, be listed
// twice. Names are recovered from their keys; a long name, whose key
// holds a hash of it, is listed under its escaped form
// (backend.ListedName), and only when prefix fits in that form's
// readable part. Waiting counts the waiters queued for a mutex, or the
// writers waiting for a shared name's readers (0 for a semaphore: not
// counted).
func (f *Factory) List(ctx context.Context, prefix string) iter.Seq2[lock.Info, error] {
	return func(yield func(lock.Info, error) bool) {
		kp := f.cfg.Options.KeyPrefix
		if kp == "" {
			kp = DefaultKeyPrefix
		}
		if f.cfg.Err != nil {
			yield(lock.Info{}, f.cfg.Err)
			return
		}
		nodes, err := f.scanners(ctx)
		if err != nil {
			yield(lock.Info{}, err)
			return
		}
		match := globQuote(kp+"{"+backend.EscapePrefix(prefix)) + "*"
		for _, node := range nodes {
			for cursor := uint64(0); ; {
				page, next, err := node.Scan(ctx, cursor, match, lock.ListPageSize).Result()
				if err != nil {
					yield(lock.Info{}, fmt.Errorf("redislock: list: %w", err))
					return
				}
				infos, err := f.listPage(ctx, kp, prefix, page)
				if err != nil {
					yield(lock.Info{}, err)
					return
				}
				for _, info := range infos {
					if !yield(info, nil) {
						return
					}
				}
				if cursor = next; cursor == 0 {
					break
				}
			}
		}
	}
}

// listPage inspects the names whose lock keys are among page.
func (f *Factory) listPage(ctx context.Context, kp, prefix string, page []string) ([]lock.Info, error) {
	type found struct {
		name, esc string
		sem       bool
	}
	var names []found
	for _, key := range page {
		rest, ok := strings.CutPrefix(key, kp+"{")
		if !ok {
			continue
		}
		esc, kind, ok := strings.Cut(rest, "}:")
		if !ok || kind != "lock" && kind != "slots" {
			continue
		}
		name, ok := backend.ListedName(esc, prefix)
		if ok {
			names = append(names, found{name, esc, kind == "slots"})
		}
	}
	if len(names) == 0 {
		return nil, nil
	}
	cmds := pipeScripts(ctx, f.c, len(names), func(i int) (*redis.Script, []string, []any) {
		return inspectScript, keysOfEscaped(kp, names[i].esc).list(), nil
	})
	now := time.Now()
	var infos []lock.Info
	for i, cmd := range cmds {
		res, err := cmd.Slice()
		if err != nil && err != redis.Nil {
			return nil, fmt.Errorf("redislock: list: %w", err)
		}
		info := parseInspect(names[i].name, res, now)
		// A name with both keys (a mutex over a semaphore's stale slots,
		// readers and a writer's placeholder) is listed once, from the
		// key the inspect script read.
		if len(info.Holders) == 0 || names[i].sem == mutexReply(res) {
			continue
		}
		infos = append(infos, info)
	}
	return infos, nil
}

// scanner is a client that can SCAN one server.
type scanner interface {
	Scan(ctx context.Context, cursor uint64, match string, count int64) *redis.ScanCmd
}

// scanners returns a client of every server that holds keys: each master
// of a cluster, each shard of a ring, or the client itself.
func (f *Factory) scanners(ctx context.Context) ([]scanner, error) {
	var mu sync.Mutex
	var nodes []scanner
	collect := func(_ context.Context, c *redis.Client) error {
		mu.Lock()
		nodes = append(nodes, c)
		mu.Unlock()
		return nil
	}
	var err error
	switch c := f.c.(type) {
	case *redis.ClusterClient:
		err = c.ForEachMaster(ctx, collect)
	case *redis.Ring:
		err = c.ForEachShard(ctx, collect)
	case scanner:
		nodes = append(nodes, c)
	default:
		err = fmt.Errorf("%w: List needs a client that can SCAN, not %T", lock.ErrInvalidOption, f.c)
	}
	if err != nil {
		return nil, fmt.Errorf("redislock: list: %w", err)
	}
	return nodes, nil
}

// globQuote quotes s for a SCAN MATCH pattern.
func globQuote(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '*', '?', '[', ']', '\\':
			b.WriteByte('\\')
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func holderInfo(tok, since, m string, msLeft int64, now time.Time) lock.HolderInfo {
	hi := lock.HolderInfo{}
	hi.Token, _ = strconv.ParseUint(tok, 10, 64)
	if ms, err := strconv.ParseInt(since, 10, 64); err == nil {
		hi.Since = time.UnixMilli(ms)
	}
	if msLeft >= 0 {
		hi.Expires = now.Add(time.Duration(msLeft) * time.Millisecond)
	}
	var md meta
	if json.Unmarshal([]byte(m), &md) == nil {
		hi.Owner, hi.Metadata = md.Owner, md.Metadata
	}
	return hi
}

// Close releases every lock the factory holds (they report ErrLockLost
// and lock.ErrClosed), fails waiting and later Acquire calls with
// lock.ErrClosed, and stops the factory's goroutines and pub/sub
// connection; it waits for the cleanup of failed acquire attempts, each
// bounded by the TTL and by backend.ReleaseTimeout. It does not close the
// Redis client.
func (f *Factory) Close() error {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return nil
	}
	f.closed = true
	close(f.closing)
	f.mu.Unlock()

	held := f.rn.drain()
	if len(held) > 0 {
		ctx, cancel := backend.ReleaseContext(context.Background())
		f.releaseMany(ctx, held)
		cancel()
	}
	closedErr := fmt.Errorf("%w: %w", ErrLockLost, lock.ErrClosed)
	for _, h := range held {
		h.lose(closedErr)
	}
	f.hub.close()
	f.wg.Wait()
	return nil
}

// releaseMany runs the release script for every holder in one pipeline.
func (f *Factory) releaseMany(ctx context.Context, hs []*Holder) {
	pipeScripts(ctx, f.c, len(hs), func(i int) (*redis.Script, []string, []any) {
		h := hs[i]
		return f.releaseCall(h.k, h.id, h.ls)
	})
}

// pipeScripts runs n scripts, call(i), in one pipeline, falling back to
// EVAL for a server that lost its script cache.
func pipeScripts(ctx context.Context, c Client, n int, call func(i int) (*redis.Script, []string, []any)) []*redis.Cmd {
	return pipeScriptsAcked(ctx, c, n, call, 0)
}

// pipeScriptsAcked is pipeScripts followed, if ack > 0, by a WAIT for ack
// replicas in the same pipeline (see WithReplicaAck): a script whose
// writes fewer replicas acknowledged fails with ErrNotReplicated.
func pipeScriptsAcked(ctx context.Context, c Client, n int, call func(i int) (*redis.Script, []string, []any), ack int) []*redis.Cmd {
	cmds := make([]*redis.Cmd, n)
	pipe := c.Pipeline()
	for i := range n {
		s, k, a := call(i)
		cmds[i] = pipe.EvalSha(ctx, s.Hash(), k, a...)
	}
	w := queueWait(ctx, pipe, c, ack)
	pipe.Exec(ctx)
	var again []int
	for i, cmd := range cmds {
		if redis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
			again = append(again, i)
		}
	}
	if len(again) > 0 {
		pipe := c.Pipeline()
		for _, i := range again {
			s, k, a := call(i)
			cmds[i] = s.Eval(ctx, pipe, k, a...)
		}
		w = queueWait(ctx, pipe, c, ack)
		pipe.Exec(ctx)
	}
	if err := w(); err != nil {
		for _, cmd := range cmds {
			if cmd.Err() == nil {
				cmd.SetErr(err)
			}
		}
	}
	return cmds
}
