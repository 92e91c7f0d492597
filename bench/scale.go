package bench

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	bsm "github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	redsyncgoredis "github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"
	"go.etcd.io/etcd/client/v3/concurrency"
	"google.golang.org/grpc"

	"github.com/ubgo/lock/etcdlock"
	"github.com/ubgo/lock/pglock"
	"github.com/ubgo/lock/redislock"
)

// renewCase is the cost of keeping cfg.Held locks alive: one renewal of
// all of them, however many passes (round trips) the library needs for it.
type renewCase struct {
	id      string
	service string
	label   string
	kind    kind
	held    int
	passes  []pass        // every pass seen
	cpu     time.Duration // client CPU (this process) over the measured windows
	renewed int           // locks renewed over the measured windows
	perLock float64       // client heap per held lock, bytes (0: not measured)
	err     error
}

// perLock is the heap grown since h0 (heapLive's), per lock of n.
func perLock(h0 uint64, n int) float64 {
	h1 := heapLive()
	if h1 < h0 {
		return 0
	}
	return float64(h1-h0) / float64(n)
}

// heapLive is the live heap after a collection, in bytes.
func heapLive() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// pass is one renewal round trip (a pipeline, an RPC, a keepalive) or, for
// libraries that renew one lock per call, one sweep over all the locks.
type pass struct {
	d     time.Duration
	rts   int // round trips
	cmds  int // commands or messages sent
	locks int // locks it renewed
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// parallel runs fn(i) for i in [0, n) on workers goroutines and returns the
// first error.
func parallel(n, workers int, fn func(i int) error) error {
	var next atomic.Int64
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if err := fn(i); err != nil {
					mu.Lock()
					first = cmpOr(first, err)
					mu.Unlock()
					next.Store(int64(n))
					return
				}
			}
		}()
	}
	wg.Wait()
	return first
}

// sweep times passes made by the caller: rounds × fn, each fn one pass.
func (c *renewCase) sweep(rounds int, fn func() (pass, error)) {
	for r := 0; r < rounds && c.err == nil; r++ {
		cpu := cpuTime()
		p, err := fn()
		if err != nil {
			c.err = err
			return
		}
		c.cpu += cpuTime() - cpu
		c.renewed += p.locks
		c.passes = append(c.passes, p)
	}
}

// Ids of the renewal floors.
const (
	idRenewRedisFloor = "redis/PEXPIRE pipeline"
	idRenewEtcdFloor  = "etcd/KeepAliveOnce"
)

// floorPasses is how many passes of a renewal floor each round times.
const floorPasses = 10

// renewWindow is how long each round watches a library's own background
// renewal, and renewTTL the lease that makes it renew about once a second.
const (
	renewTTL    = 3 * time.Second
	renewWindow = 2100 * time.Millisecond
)

// watch lets a library renew on its own for rounds windows and collects
// the passes rec saw.
func (c *renewCase) watch(rounds int, rec *recorder) {
	time.Sleep(renewTTL / 3) // let the passes of the acquire phase settle
	for r := 0; r < rounds; r++ {
		rec.start()
		cpu := cpuTime()
		time.Sleep(renewWindow)
		c.cpu += cpuTime() - cpu
		for _, p := range rec.stop() {
			c.renewed += p.locks
			c.passes = append(c.passes, p)
		}
	}
}

// recorder collects passes while on.
type recorder struct {
	mu     sync.Mutex
	on     bool
	passes []pass
}

func (r *recorder) start() {
	r.mu.Lock()
	r.on, r.passes = true, nil
	r.mu.Unlock()
}

func (r *recorder) stop() []pass {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.on = false
	return r.passes
}

func (r *recorder) add(p pass) {
	r.mu.Lock()
	if r.on {
		r.passes = append(r.passes, p)
	}
	r.mu.Unlock()
}

// pipeHook times the pipelines of a go-redis client: redislock renews in
// one pipeline of scripts per pass.
type pipeHook struct{ rec *recorder }

func (h pipeHook) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h pipeHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h pipeHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		t0 := time.Now()
		err := next(ctx, cmds)
		p := pass{d: time.Since(t0), rts: 1, cmds: len(cmds)}
		for _, c := range cmds {
			// EVALSHA sha numkeys key...
			if a := c.Args(); len(a) > 2 {
				if n, err := strconv.Atoi(fmt.Sprint(a[2])); err == nil {
					p.locks += n
				}
			}
		}
		h.rec.add(p)
		return err
	}
}

// leaseTimer times lease keepalives on an etcd client: the time from each
// keepalive request sent to its answer.
type leaseTimer struct {
	rec  *recorder
	held func() int // locks on the lease
}

func (t *leaseTimer) interceptor(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	s, err := streamer(ctx, desc, cc, method, opts...)
	if err != nil || method != "/etcdserverpb.Lease/LeaseKeepAlive" {
		return s, err
	}
	return &timedStream{ClientStream: s, t: t}, nil
}

type timedStream struct {
	grpc.ClientStream
	t    *leaseTimer
	mu   sync.Mutex
	sent []time.Time
}

func (s *timedStream) SendMsg(m any) error {
	s.mu.Lock()
	s.sent = append(s.sent, time.Now())
	s.mu.Unlock()
	return s.ClientStream.SendMsg(m)
}

func (s *timedStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if err != nil {
		return err
	}
	s.mu.Lock()
	var t0 time.Time
	if len(s.sent) > 0 {
		t0, s.sent = s.sent[0], s.sent[1:]
	}
	s.mu.Unlock()
	if !t0.IsZero() {
		s.t.rec.add(pass{d: time.Since(t0), rts: 1, cmds: 1, locks: s.t.held()})
	}
	return nil
}

// runRenewal measures the renewal of cfg.Held held locks on Redis and etcd,
// one library after the other (holding the locks of two at once would
// measure one under the load of the other's renewal).
func runRenewal(ctx context.Context, e *env, logf func(string, ...any)) []*renewCase {
	var out []*renewCase
	if e.available(Redis) {
		out = append(out, renewRedis(ctx, e, logf)...)
	}
	if e.available(Etcd) {
		out = append(out, renewEtcd(ctx, e, logf)...)
	}
	return out
}

func renewRedis(ctx context.Context, e *env, logf func(string, ...any)) []*renewCase {
	var out []*renewCase
	want := func(id string) bool { return e.cfg.want("renewal", id) }
	if want(idRenewRedisFloor) {
		out = append(out, renewRedisFloor(ctx, e))
	}
	if want(idRedislock) {
		out = append(out, renewRedislock(ctx, e, logf))
	}
	if want(idBsm) {
		out = append(out, renewBsm(ctx, e, logf))
	}
	if want(idRedsync) {
		out = append(out, renewRedsync(ctx, e, logf))
	}
	return out
}

const redisWorkers = 16

func newRenewCase(e *env, service, id, label string, k kind) *renewCase {
	return &renewCase{id: id, service: service, label: label, kind: k, held: e.cfg.Held}
}

func renewRedisFloor(ctx context.Context, e *env) *renewCase {
	n, rounds, rdb := e.cfg.Held, e.cfg.RRounds, e.rdb
	floor := newRenewCase(e, Redis, idRenewRedisFloor, "one pipeline of a PEXPIRE per lock (no ownership check)", floorKind)
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("%srenew-floor/{%d}", e.prefix, i)
	}
	setAll := rdb.Pipeline()
	for _, k := range keys {
		setAll.Set(ctx, k, "v", time.Minute)
	}
	if _, err := setAll.Exec(ctx); err != nil {
		floor.err = err
	}
	renewAll := func() (pass, error) {
		t0 := time.Now()
		pipe := rdb.Pipeline()
		for _, k := range keys {
			pipe.PExpire(ctx, k, time.Minute)
		}
		_, err := pipe.Exec(ctx)
		return pass{d: time.Since(t0), rts: 1, cmds: n, locks: n}, err
	}
	// A floor pass is short: take more of them, after one untimed.
	if floor.err == nil {
		_, floor.err = renewAll()
	}
	floor.sweep(floorPasses*rounds, renewAll)
	rdb.Unlink(ctx, keys...)
	return floor
}

func renewRedislock(ctx context.Context, e *env, logf func(string, ...any)) *renewCase {
	n, rounds := e.cfg.Held, e.cfg.RRounds
	// redislock: its own client, so that the hook sees only its renewal.
	logf("  redislock: holding %d locks", n)
	ours := newRenewCase(e, Redis, idRedislock, fmt.Sprintf("redislock background renewal (TTL %v)", renewTTL), oursKind)
	rec := &recorder{}
	if c, err := dialRedis(ctx, nil); err != nil {
		ours.err = err
	} else {
		c.AddHook(pipeHook{rec})
		f := redislock.NewFactory(c, redislock.WithKeyPrefix(e.prefix+"renew/"), redislock.WithLogger(nil),
			redislock.WithTTL(renewTTL), redislock.WithAutoRenew(true))
		hs := make([]*redislock.Holder, n)
		names := make([]string, n)
		for i := range names {
			names[i] = strconv.Itoa(i)
		}
		h0 := heapLive()
		ours.err = parallel(n, redisWorkers, func(i int) (err error) {
			hs[i], err = f.Acquire(ctx, names[i])
			return err
		})
		if ours.err == nil {
			ours.perLock = perLock(h0, n)
			ours.watch(rounds, rec)
			for _, h := range hs {
				if err := h.Err(); err != nil {
					ours.err = fmt.Errorf("a lock was lost during renewal: %w", err)
					break
				}
			}
		}
		f.Close()
		c.Close()
	}
	return ours
}

func renewBsm(ctx context.Context, e *env, logf func(string, ...any)) *renewCase {
	n, rounds, rdb, workers := e.cfg.Held, e.cfg.RRounds, e.rdb, redisWorkers
	logf("  bsm/redislock: holding %d locks", n)
	b := newRenewCase(e, Redis, idBsm, fmt.Sprintf("bsm/redislock Refresh per lock, %d at a time", workers), peerKind)
	bc := bsm.New(rdb)
	bl := make([]*bsm.Lock, n)
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("%srenew-bsm/%d", e.prefix, i)
	}
	h0 := heapLive()
	b.err = parallel(n, workers, func(i int) (err error) {
		bl[i], err = bc.Obtain(ctx, names[i], time.Minute, nil)
		return err
	})
	if b.err == nil {
		b.perLock = perLock(h0, n)
	}
	b.sweep(rounds, func() (pass, error) {
		t0 := time.Now()
		err := parallel(n, workers, func(i int) error { return bl[i].Refresh(ctx, time.Minute, nil) })
		return pass{d: time.Since(t0), rts: n, cmds: n, locks: n}, err
	})
	parallel(n, workers, func(i int) error {
		if bl[i] != nil {
			bl[i].Release(ctx)
		}
		return nil
	})
	return b
}

func renewRedsync(ctx context.Context, e *env, logf func(string, ...any)) *renewCase {
	n, rounds, rdb, workers := e.cfg.Held, e.cfg.RRounds, e.rdb, redisWorkers
	logf("  redsync: holding %d locks", n)
	rsc := newRenewCase(e, Redis, idRedsync, fmt.Sprintf("redsync Extend per lock, %d at a time", workers), peerKind)
	rs := redsync.New(redsyncgoredis.NewPool(rdb))
	ms := make([]*redsync.Mutex, n)
	for i := range ms {
		ms[i] = rs.NewMutex(fmt.Sprintf("%srenew-redsync/%d", e.prefix, i), redsync.WithExpiry(time.Minute), redsync.WithTries(1))
	}
	rsc.err = parallel(n, workers, func(i int) error { return ms[i].LockContext(ctx) })
	rsc.sweep(rounds, func() (pass, error) {
		t0 := time.Now()
		err := parallel(n, workers, func(i int) error {
			ok, err := ms[i].ExtendContext(ctx)
			if err == nil && !ok {
				err = fmt.Errorf("redsync: extend failed")
			}
			return err
		})
		return pass{d: time.Since(t0), rts: n, cmds: n, locks: n}, err
	})
	parallel(n, workers, func(i int) error { ms[i].UnlockContext(ctx); return nil })
	return rsc
}

func renewEtcd(ctx context.Context, e *env, logf func(string, ...any)) []*renewCase {
	n, rounds := e.cfg.Held, e.cfg.RRounds
	const workers = 128 // etcd commits concurrent writes together: one fsync for many
	mk := func(id, label string, k kind) *renewCase {
		return &renewCase{id: id, service: Etcd, label: label, kind: k, held: n}
	}

	var out []*renewCase
	want := func(id string) bool { return e.cfg.want("renewal", id) }
	floor := mk(idRenewEtcdFloor, "one keepalive of the lease all locks are on", floorKind)
	if !want(idRenewEtcdFloor) {
		floor.err = errSkip
	} else if lease, err := e.etcd.Grant(ctx, 60); err != nil {
		floor.err = err
	} else {
		e.etcd.KeepAliveOnce(ctx, lease.ID) // untimed: the first opens the stream
		floor.sweep(floorPasses*rounds, func() (pass, error) {
			t0 := time.Now()
			_, err := e.etcd.KeepAliveOnce(ctx, lease.ID)
			return pass{d: time.Since(t0), rts: 1, cmds: 1, locks: n}, err
		})
		e.etcd.Revoke(ctx, lease.ID)
	}

	logf("  etcdlock: holding %d locks", n)
	ours := mk(idEtcdlock, fmt.Sprintf("etcdlock background renewal (TTL %v)", renewTTL), oursKind)
	var held atomic.Int64
	rec := &recorder{}
	lt := &leaseTimer{rec: rec, held: func() int { return int(held.Load()) }}
	if !want(idEtcdlock) {
		ours.err = errSkip
	} else if cli, err := dialEtcd(ctx, grpc.WithChainStreamInterceptor(lt.interceptor)); err != nil {
		ours.err = err
	} else {
		f := etcdlock.NewFactory(cli, etcdlock.WithKeyPrefix(e.prefix+"renew/"), etcdlock.WithLogger(nil), etcdlock.WithTTL(renewTTL))
		hs := make([]*etcdlock.Holder, n)
		ours.err = parallel(n, workers, func(i int) (err error) {
			if hs[i], err = f.Acquire(ctx, strconv.Itoa(i)); err == nil {
				held.Add(1)
			}
			return err
		})
		if ours.err == nil {
			ours.watch(rounds, rec)
			for _, h := range hs {
				if err := h.Err(); err != nil {
					ours.err = fmt.Errorf("a lock was lost during renewal: %w", err)
					break
				}
			}
		}
		f.Close() // revokes the lease: one round trip frees every lock
		cli.Close()
	}

	logf("  concurrency.Mutex: holding %d locks", n)
	peer := mk(idEtcdMutex, fmt.Sprintf("concurrency.Session keepalive (TTL %v), all mutexes on one session", renewTTL), peerKind)
	var pheld atomic.Int64
	prec := &recorder{}
	plt := &leaseTimer{rec: prec, held: func() int { return int(pheld.Load()) }}
	if !want(idEtcdMutex) {
		peer.err = errSkip
	} else if cli, err := dialEtcd(ctx, grpc.WithChainStreamInterceptor(plt.interceptor)); err != nil {
		peer.err = err
	} else if s, err := concurrency.NewSession(cli, concurrency.WithTTL(int(renewTTL/time.Second))); err != nil {
		peer.err = err
		cli.Close()
	} else {
		peer.err = parallel(n, workers, func(i int) error {
			m := concurrency.NewMutex(s, fmt.Sprintf("%srenew-mutex/%d", e.prefix, i))
			err := m.Lock(ctx)
			if err == nil {
				pheld.Add(1)
			}
			return err
		})
		if peer.err == nil {
			peer.watch(rounds, prec)
			select {
			case <-s.Done():
				peer.err = fmt.Errorf("concurrency.Session expired during renewal")
			default:
			}
		}
		s.Close()
		cli.Close()
	}
	for _, c := range []*renewCase{floor, ours, peer} {
		if c.err != errSkip {
			out = append(out, c)
		}
	}
	return out
}

var errSkip = errors.New("not selected")

// connCase counts the connections that cfg.Held held Postgres locks take,
// and what holding them costs each statement on those connections.
type connCase struct {
	label    string
	held     int
	conns    int
	maxConns int
	rate     float64 // acquires per second while taking them, 16 at a time
	release  summary // single Releases while (nearly) all are held
	err      error
}

func runConns(ctx context.Context, e *env) []*connCase {
	if !e.available(Postgres) || !e.cfg.want("connections", "postgres") {
		return nil
	}
	n := e.cfg.Held
	app := fmt.Sprintf("ubgo-lock-bench-hold-%d", time.Now().UnixNano()%1e9)
	c := &connCase{label: "pglock, default options (WithSessions 2)", held: n}
	f := pglock.NewFactory(e.pool, pglock.WithLogger(nil), pglock.WithApplicationName(app), pglock.WithKeyPrefix(e.prefix+"hold/"))
	defer f.Close() // closes its sessions, which frees what is still held at once
	hs := make([]*pglock.Holder, n)
	var got atomic.Int64
	t0 := time.Now()
	c.err = parallel(n, 16, func(i int) (err error) {
		if hs[i], err = f.Acquire(ctx, strconv.Itoa(i)); err == nil {
			got.Add(1)
		}
		return err
	})
	c.rate = float64(got.Load()) / time.Since(t0).Seconds()
	if c.err != nil {
		// Postgres' shared lock table is full (out of shared memory) or
		// the server went away: say how far it got.
		c.err = fmt.Errorf("after %d locks held: %w", got.Load(), c.err)
	}
	if c.err == nil {
		c.err = e.pool.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", app).Scan(&c.conns)
	}
	if c.err == nil {
		var s string
		if c.err = e.pool.QueryRow(ctx, "SHOW max_connections").Scan(&s); c.err == nil {
			c.maxConns, _ = strconv.Atoi(s)
		}
	}
	if c.err == nil {
		var ds []time.Duration
		for _, h := range hs[:min(len(hs), 200)] {
			t := time.Now()
			if err := h.Release(); err != nil {
				c.err = err
				break
			}
			ds = append(ds, time.Since(t))
		}
		c.release = summarize(ds)
	}
	return []*connCase{c}
}
