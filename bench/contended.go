package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	bsm "github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	redsyncgoredis "github.com/go-redsync/redsync/v4/redis/goredis/v9"
	gofrs "github.com/gofrs/flock"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/ubgo/lock/etcdlock"
	"github.com/ubgo/lock/filelock"
	"github.com/ubgo/lock/flock"
	"github.com/ubgo/lock/memlock"
	"github.com/ubgo/lock/pglock"
	"github.com/ubgo/lock/redislock"
)

// A contender is one participant that takes the lock in turn with the
// others: a goroutine with its own factory and client wherever the backend
// has them, as a separate process would.
type contender struct {
	lock   func(ctx context.Context) error
	unlock func() error
}

// holding is the contender that takes the lock with acquire and releases
// the holder it got.
func holding[H interface{ Release() error }](acquire func(context.Context) (H, error)) contender {
	var h H
	return contender{
		lock:   func(ctx context.Context) (err error) { h, err = acquire(ctx); return err },
		unlock: func() error { return h.Release() },
	}
}

// contCase is a contended case: n contenders on one name, each taking the
// lock (or a permit) and giving it back at once, as fast as they can.
type contCase struct {
	id      string
	service string
	label   string
	kind    kind
	n       int           // contenders
	rtt     string        // one round trip of the same service, by opCase id
	limit   int           // 1: mutex; n: semaphore of n permits
	hold    time.Duration // how long each holder keeps the lock
	cs      []contender
	build   pgBuild  // Postgres: makes the contenders on a pool, for pgCount
	count   *contRes // Postgres: the round of pgCount, on connections of its own
	err     error
	overrun atomic.Bool  // more than limit holders were ever inside at once
	maxIn   atomic.Int32 // most holders seen inside at once
	res     [numConds][]contRes
}

type contRes struct {
	handoff    summary       // release called → next holder's acquire returned (mutex only)
	throughput float64       // acquisitions per second
	maxWait    time.Duration // longest single acquire: starvation
	fewest     int           // acquisitions of the least lucky contender
	most       int           // and of the luckiest
	total      int           // acquisitions of all
	retakes    int           // acquisitions by the contender that held the lock just before (mutex only)
	work       work          // what the service counted over the round
	counted    bool          // work was counted
}

// contClients are the per-contender clients, shared by the cases of one
// service (cases run one at a time).
type contClients struct {
	once  sync.Once
	redis []*redis.Client
	etcd  []*clientv3.Client
	pool  *pgxpool.Pool
	errs  map[string]error
}

func (e *env) contenderClients(ctx context.Context, n int) *contClients {
	cc := e.cc[n]
	if cc == nil {
		cc = &contClients{}
		e.cc[n] = cc
	}
	cc.once.Do(func() {
		cc.errs = map[string]error{}
		if e.available(Redis) {
			for i := 0; i < n; i++ {
				c, err := dialRedis(ctx, nil)
				if err != nil {
					cc.errs[Redis] = err
					break
				}
				e.defer_(func() { c.Close() })
				cc.redis = append(cc.redis, c)
			}
		}
		if e.available(Etcd) {
			for i := 0; i < n; i++ {
				c, err := dialEtcd(ctx)
				if err != nil {
					cc.errs[Etcd] = err
					break
				}
				e.defer_(func() { c.Close() })
				cc.etcd = append(cc.etcd, c)
			}
		}
		if e.available(Postgres) {
			// The blocking advisory lock floor holds one connection
			// per contender, and the one-factory case's sessions come
			// from here too (the factory-each case dials pools of its
			// own).
			p, err := dialPostgresApp(ctx, e.pgConns(ctx, n+8), benchApp)
			if err != nil {
				cc.errs[Postgres] = err
			} else {
				e.defer_(p.Close)
				cc.pool = p
			}
		}
	})
	return cc
}

// pgConns is how many connections the contenders' pool may open: want,
// or what the server has left if that is less (keeping some for the rest
// of the benchmark and for other clients of the server).
func (e *env) pgConns(ctx context.Context, want int) int32 {
	const reserve = 40
	var limit, used int
	err := e.pool.QueryRow(ctx, "SELECT current_setting('max_connections')::int, (SELECT count(*) FROM pg_stat_activity)").Scan(&limit, &used)
	if err == nil && limit-used-reserve < want {
		want = max(limit-used-reserve, 4)
	}
	return int32(want)
}

// contendedCases builds the mutex cases (limit 1, with the peers) or the
// semaphore cases (limit n, ours only: the peers have no semaphore) for n
// contenders. A crowd (n other than the first of cfg.Waiters) has only
// the network backends' cases with a factory (or client) per contender,
// the way many processes would wait.
func contendedCases(ctx context.Context, e *env, limit, n int) []*contCase {
	cc := e.contenderClients(ctx, n)
	crowd := n != e.cfg.waiters()
	name := "contended"
	if limit > 1 {
		name = "semaphore"
	}
	if crowd {
		name = fmt.Sprintf("%s-%d", name, n)
	}
	var out []*contCase
	add := func(c *contCase) {
		if crowd && (c.service == "" || strings.Contains(c.id, "one factory")) {
			return
		}
		c.limit, c.n = limit, n
		if limit > 1 {
			// Long enough for the permits to overlap, so that the
			// semaphore shows it admits up to limit holders at once.
			c.hold = semHold
		}
		out = append(out, c)
	}
	dir := filepath.Join(e.dir, fmt.Sprintf("contended-%d", limit))
	dirErr := os.MkdirAll(dir, 0o755)

	// memlock: one factory (the only way its waiters meet).
	mf := memlock.NewFactory(memlock.WithLogger(nil), memlock.WithWait(), memlock.WithMaxConcurrent(limit))
	e.defer_(func() { mf.Close() })
	add(&contCase{id: "memory/memlock", label: "memlock, one factory", kind: oursKind, cs: contenders(n, func(int) contender {
		return holding(func(ctx context.Context) (*memlock.Holder, error) { return mf.Acquire(ctx, name) })
	})})

	fdir := filepath.Join(dir, "flock")
	add(&contCase{id: "file/flock", label: "flock, a factory each", kind: oursKind, err: dirErr, cs: contenders(n, func(int) contender {
		f := flock.NewFactory(flock.WithDir(fdir), flock.WithLogger(nil), flock.WithWait(), flock.WithMaxConcurrent(limit))
		e.defer_(func() { f.Close() })
		return holding(func(ctx context.Context) (*flock.Holder, error) { return f.Acquire(ctx, name) })
	})})

	ldir := filepath.Join(dir, "filelock")
	add(&contCase{id: "file/filelock", label: "filelock, a factory each", kind: oursKind, err: dirErr, cs: contenders(n, func(int) contender {
		f := filelock.NewFactory(filelock.WithDir(ldir), filelock.WithLogger(nil), filelock.WithWait(), filelock.WithMaxConcurrent(limit))
		e.defer_(func() { f.Close() })
		return holding(func(ctx context.Context) (*filelock.Holder, error) { return f.Acquire(ctx, name) })
	})})

	if limit == 1 {
		gpath := filepath.Join(dir, "gofrs.lock")
		add(&contCase{id: "file/gofrs-flock", label: "gofrs/flock Lock (blocking flock), one Flock each", kind: peerKind, err: dirErr, cs: contenders(n, func(int) contender {
			g := gofrs.New(gpath)
			return contender{lock: func(context.Context) error { return g.Lock() }, unlock: g.Unlock}
		})})
	}

	if e.available(Postgres) {
		// The Postgres cases are built by a function of the pool, so that
		// pgCount can build them again on connections of their own.
		pgCase := func(c *contCase, build pgBuild) {
			c.build = build
			if c.err == nil {
				c.cs, c.err = build(ctx, cc.pool, benchApp, e.defer_)
			}
			add(c)
		}
		pgCase(&contCase{id: idPglock, service: Postgres, rtt: idSelect1, label: "pglock, a factory each", kind: oursKind, err: cc.errs[Postgres]},
			func(ctx context.Context, _ *pgxpool.Pool, app string, defer_ func(func())) ([]contender, error) {
				// A pool each, as separate processes have: pgx's
				// default size, which a factory's lock session, wait
				// session and listener fit in.
				var first error
				cs := contenders(n, func(int) contender {
					pool, err := dialPostgresApp(ctx, 0, app)
					if err != nil {
						first = cmpOr(first, err)
						return contender{}
					}
					defer_(pool.Close)
					f := pglock.NewFactory(pool, pglock.WithLogger(nil), pglock.WithWait(), pglock.WithMaxConcurrent(limit),
						pglock.WithKeyPrefix(e.prefix), pglock.WithApplicationName(app))
					defer_(func() { f.Close() })
					return holding(func(ctx context.Context) (*pglock.Holder, error) { return f.Acquire(ctx, name) })
				})
				return cs, first
			})
		if limit == 1 {
			pgCase(&contCase{id: idPglock + ", one factory", service: Postgres, rtt: idSelect1, label: "pglock, one factory for all", kind: oursKind, err: cc.errs[Postgres]},
				func(ctx context.Context, pool *pgxpool.Pool, app string, defer_ func(func())) ([]contender, error) {
					f := pglock.NewFactory(pool, pglock.WithLogger(nil), pglock.WithWait(), pglock.WithMaxConcurrent(limit),
						pglock.WithKeyPrefix(e.prefix), pglock.WithApplicationName(app))
					defer_(func() { f.Close() })
					return contenders(n, func(int) contender {
						return holding(func(ctx context.Context) (*pglock.Holder, error) { return f.Acquire(ctx, name) })
					}), nil
				})
			// The floor of a wait on Postgres: the server queues the
			// blocked sessions and wakes one per unlock, in order.
			pgCase(&contCase{id: idPgBlocking, service: Postgres, rtt: idSelect1, kind: floorKind, err: cc.errs[Postgres],
				label: "pg_advisory_lock (blocking) + pg_advisory_unlock, a connection each"},
				func(ctx context.Context, pool *pgxpool.Pool, _ string, defer_ func(func())) ([]contender, error) {
					const key = int64(0x75626f2d636f6e74) // arbitrary, outside pglock's keys
					var first error
					cs := contenders(n, func(int) contender {
						pc, err := pool.Acquire(ctx)
						if err != nil {
							first = cmpOr(first, err)
							return contender{}
						}
						defer_(pc.Release)
						conn := pc.Conn()
						return contender{
							lock: func(ctx context.Context) error {
								_, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", key)
								return err
							},
							unlock: func() error {
								var ok bool
								err := conn.QueryRow(context.Background(), "SELECT pg_advisory_unlock($1)", key).Scan(&ok)
								if err == nil && !ok {
									err = errors.New("pg_advisory_unlock: not held")
								}
								return err
							},
						}
					})
					return cs, first
				})
		}
	}

	if e.available(Redis) {
		err := cc.errs[Redis]
		c := &contCase{id: idRedislock, service: Redis, rtt: idPing, label: "redislock, a factory and client each", kind: oursKind, err: err}
		if err == nil {
			c.cs = contenders(n, func(i int) contender {
				f := redislock.NewFactory(cc.redis[i], redislock.WithKeyPrefix(e.prefix), redislock.WithLogger(nil),
					redislock.WithWait(), redislock.WithMaxConcurrent(limit))
				e.defer_(func() { f.Close() })
				return holding(func(ctx context.Context) (*redislock.Holder, error) { return f.Acquire(ctx, name) })
			})
		}
		add(c)
		if limit == 1 {
			c := &contCase{id: idRedislock + ", one factory", service: Redis, rtt: idPing, label: "redislock, one factory and client for all", kind: oursKind, err: err}
			if err == nil {
				f := redislock.NewFactory(cc.redis[0], redislock.WithKeyPrefix(e.prefix), redislock.WithLogger(nil),
					redislock.WithWait(), redislock.WithMaxConcurrent(limit))
				e.defer_(func() { f.Close() })
				c.cs = contenders(n, func(i int) contender {
					return holding(func(ctx context.Context) (*redislock.Holder, error) { return f.Acquire(ctx, name) })
				})
			}
			add(c)
		}
		if limit == 1 {
			poll := e.cfg.PeerPoll
			c := &contCase{id: idBsm, service: Redis, rtt: idPing, kind: peerKind, err: err,
				label: fmt.Sprintf("bsm/redislock, polling every %v, a client each", poll)}
			if err == nil {
				key := e.prefix + "bsm-" + name
				c.cs = contenders(n, func(i int) contender {
					b := bsm.New(cc.redis[i])
					opt := &bsm.Options{RetryStrategy: bsm.LinearBackoff(poll)}
					var l *bsm.Lock
					return contender{
						lock:   func(ctx context.Context) (err error) { l, err = b.Obtain(ctx, key, 30*time.Second, opt); return err },
						unlock: func() error { return l.Release(context.Background()) },
					}
				})
			}
			add(c)
			c = &contCase{id: idRedsync, service: Redis, rtt: idPing, kind: peerKind, err: err,
				label: fmt.Sprintf("redsync, polling every %v, a client each", poll)}
			if err == nil {
				key := e.prefix + "redsync-" + name
				c.cs = contenders(n, func(i int) contender {
					m := redsync.New(redsyncgoredis.NewPool(cc.redis[i])).NewMutex(key,
						redsync.WithExpiry(30*time.Second), redsync.WithTries(math.MaxInt32), redsync.WithRetryDelay(poll))
					return contender{
						lock:   m.LockContext,
						unlock: func() error { _, err := m.UnlockContext(context.Background()); return err },
					}
				})
			}
			add(c)
		}
	}

	if e.available(Etcd) {
		err := cc.errs[Etcd]
		c := &contCase{id: idEtcdlock, service: Etcd, rtt: idEtcdPut, label: "etcdlock, a factory and client each", kind: oursKind, err: err}
		if err == nil {
			c.cs = contenders(n, func(i int) contender {
				f := etcdlock.NewFactory(cc.etcd[i], etcdlock.WithKeyPrefix(e.prefix+"etcdlock/"), etcdlock.WithLogger(nil),
					etcdlock.WithWait(), etcdlock.WithMaxConcurrent(limit))
				e.defer_(func() { f.Close() })
				return holding(func(ctx context.Context) (*etcdlock.Holder, error) { return f.Acquire(ctx, name) })
			})
		}
		add(c)
		if limit == 1 {
			c := &contCase{id: idEtcdlock + ", one factory", service: Etcd, rtt: idEtcdPut, label: "etcdlock, one factory and client for all", kind: oursKind, err: err}
			if err == nil {
				f := etcdlock.NewFactory(cc.etcd[0], etcdlock.WithKeyPrefix(e.prefix+"etcdlock/"), etcdlock.WithLogger(nil),
					etcdlock.WithWait(), etcdlock.WithMaxConcurrent(limit))
				e.defer_(func() { f.Close() })
				c.cs = contenders(n, func(i int) contender {
					return holding(func(ctx context.Context) (*etcdlock.Holder, error) { return f.Acquire(ctx, name) })
				})
			}
			add(c)
		}
		if limit == 1 {
			c := &contCase{id: idEtcdMutex, service: Etcd, rtt: idEtcdPut, label: "concurrency.Mutex, a client and session each", kind: peerKind, err: err}
			if err == nil {
				c.cs = contenders(n, func(i int) contender {
					s, err := concurrency.NewSession(cc.etcd[i], concurrency.WithTTL(60))
					if err != nil {
						c.err = err
						return contender{}
					}
					e.defer_(func() { s.Close() })
					m := concurrency.NewMutex(s, e.prefix+"mutex-"+name)
					return contender{lock: m.Lock, unlock: func() error { return m.Unlock(context.Background()) }}
				})
			}
			add(c)
		}
	}
	return out
}

// semHold is how long a semaphore holder keeps its permit.
const semHold = time.Millisecond

func contenders(n int, mk func(i int) contender) []contender {
	cs := make([]contender, n)
	for i := range cs {
		cs[i] = mk(i)
	}
	return cs
}

// warm takes and gives back the lock once per contender, alone: dials,
// leases and watches are set up before anything is measured.
func warm(ctx context.Context, cs []contender) error {
	for _, ct := range cs {
		if err := ct.lock(ctx); err != nil {
			return err
		}
		if err := ct.unlock(); err != nil {
			return err
		}
	}
	return nil
}

// runContended runs every contended case cfg.CRounds times in each
// condition, rotating the order each round. The cases run one at a time,
// never two at once: the servers' counters of one case's round must see
// no other case's work.
func runContended(ctx context.Context, cases []*contCase, cfg Config, sp *spinner, ctr *counters) {
	for _, c := range cases {
		if c.err == nil { // a case that could not be built keeps its error
			c.err = warm(ctx, c.cs)
		}
	}
	for r := 0; r < cfg.CRounds; r++ {
		for _, cd := range conds(sp, r) {
			sp.set(cd == busy)
			for i := range cases {
				c := cases[(i+r)%len(cases)]
				if c.err == nil {
					c.round(ctx, cd, cfg.Contend, ctr)
				}
			}
		}
	}
	sp.set(false)
}

// round lets the contenders run for d and records one contRes, with the
// service's own count of its work over the round where ctr counts it.
func (c *contCase) round(ctx context.Context, cd cond, d time.Duration, ctr *counters) {
	count := ctr.counts(c.service)
	var w0 work
	if count {
		var err error
		if w0, err = ctr.read(ctx, c.service); err != nil {
			c.err = fmt.Errorf("reading %s's counters: %w", c.service, err)
			return
		}
	}
	res, err := c.window(ctx, c.cs, d)
	if err != nil {
		c.err = err
		return
	}
	if count {
		w1, err := ctr.read(ctx, c.service)
		if err != nil {
			c.err = fmt.Errorf("reading %s's counters: %w", c.service, err)
			return
		}
		res.work, res.counted = w1.sub(w0), true
	}
	c.res[cd] = append(c.res[cd], res)
}

// window lets the contenders cs run for d. Each finishes the acquisition
// it is waiting for when d is up, so every acquisition the servers saw
// is counted.
func (c *contCase) window(ctx context.Context, cs []contender, d time.Duration) (contRes, error) {
	hold := c.hold
	ctx, cancel := context.WithTimeout(ctx, d+time.Minute)
	defer cancel()
	var (
		rec       sync.Mutex // guards what follows
		handoffs  []time.Duration
		lastStart time.Time // when the last holder started its release
		lastBy    = -1
		retakes   int
		maxWait   time.Duration
		counts    = make([]int, len(cs))
		firstErr  error
		inside    atomic.Int32
		wg        sync.WaitGroup
	)
	start := time.Now()
	deadline := start.Add(d)
	var end atomic.Int64
	for i, ct := range cs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) {
				t0 := time.Now()
				err := ct.lock(ctx)
				t1 := time.Now()
				if err != nil {
					rec.Lock()
					firstErr = cmpOr(firstErr, err)
					rec.Unlock()
					cancel()
					return
				}
				in := inside.Add(1)
				if int(in) > c.limit {
					c.overrun.Store(true)
				}
				for m := c.maxIn.Load(); in > m && !c.maxIn.CompareAndSwap(m, in); m = c.maxIn.Load() {
				}
				rec.Lock()
				counts[i]++
				maxWait = max(maxWait, t1.Sub(t0))
				if c.limit == 1 && lastBy >= 0 {
					if lastBy != i {
						handoffs = append(handoffs, t1.Sub(lastStart))
					} else {
						retakes++
					}
				}
				rec.Unlock()
				if hold > 0 {
					time.Sleep(hold)
				}
				rec.Lock()
				lastBy = i
				inside.Add(-1)
				lastStart = time.Now()
				rec.Unlock()
				if err := ct.unlock(); err != nil {
					rec.Lock()
					firstErr = cmpOr(firstErr, err)
					rec.Unlock()
					cancel()
					return
				}
				end.Store(int64(time.Since(start)))
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return contRes{}, firstErr
	}
	total, fewest, most := 0, math.MaxInt, 0
	for _, n := range counts {
		total += n
		fewest, most = min(fewest, n), max(most, n)
	}
	return contRes{
		handoff:    summarize(handoffs),
		throughput: float64(total) / time.Duration(end.Load()).Seconds(),
		maxWait:    maxWait,
		fewest:     fewest,
		most:       most,
		total:      total,
		retakes:    retakes,
	}, nil
}

func cmpOr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}
