//go:build linux

package chaos

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/etcdlock"
	"github.com/ubgo/lock/filelock"
	"github.com/ubgo/lock/flock"
	"github.com/ubgo/lock/internal/testenv"
	"github.com/ubgo/lock/memlock"
	"github.com/ubgo/lock/pglock"
	"github.com/ubgo/lock/redislock"
)

// exclusion is what a backend promises about overlapping critical sections.
type exclusion int

const (
	// kernelExclusion: no two critical sections ever overlap (flock).
	kernelExclusion exclusion = iota
	// sessionExclusion: overlap only after the holder's session ended
	// behind its back (pglock: pg_terminate_backend, a dropped
	// connection), and the holder must then be told.
	sessionExclusion
	// leaseExclusion: overlap only between a holder whose lease ran out
	// and its successor (redislock, etcdlock, filelock's stale window).
	leaseExclusion
)

func (e exclusion) String() string {
	return [...]string{"kernel (none at all)", "session (only after the session ended)", "lease (only after the lease ran out)"}[e]
}

// Fault kinds.
const (
	fKill      = "kill"      // SIGKILL of a holder
	fStop      = "stop"      // SIGSTOP of a holder, SIGCONT after stopFor
	fStopWait  = "stopwait"  // SIGSTOP of a waiting client, SIGCONT after stopFor
	fCancel    = "cancel"    // a waiter's Acquire ctx cancelled
	fRestart   = "restart"   // server killed and started again
	fDrop      = "drop"      // every client connection reset by the proxy
	fStall     = "stall"     // all traffic held by the proxy for stallFor
	fTerminate = "terminate" // pg_terminate_backend of the holder's lock session
	fLoss      = "loss"      // memlock: ForceLoss of the holder
)

type backendDef struct {
	name  string
	class exclusion
	ttl   time.Duration // lease length; 0: none
	// recover is the bound the backend documents from the end of a fault
	// to the moment a waiting contender can have the lock.
	recover time.Duration
	faults  []string
	stopFor time.Duration // how long a SIGSTOP lasts
	// queueSeen: the backend's Inspect counts the waiters queued in its
	// store (lock.Info.Waiting), so a test can wait for a waiter's place.
	queueSeen bool
	// guarded: a process stopped inside the name's guard (a flock(2) on a
	// file of the run's CHAOS_DIR) blocks the name until it continues, as
	// the backend's guide says (filelock).
	guarded   bool
	stallFor  time.Duration // how long a proxy stall lasts
	inProcess bool          // clients are goroutines (memlock: no other way)
	// shared says the backend honours lock.WithShared: it also runs the
	// shared workload, as "<name>-shared" (see sharedDefs).
	shared bool
	// mix makes this run the shared workload: each critical section is a
	// reader's (WithShared, a fenced read) or a writer's.
	mix bool
	// setup runs in the parent: it starts private servers and proxies,
	// adds the clients' environment and the backend's own faults.
	setup func(r *run) error
	// client builds the contender's Lockers (waiting, renewing; with the
	// options given, such as lock.WithShared) from the environment setup
	// wrote: one factory per client.
	client func(getenv func(string) string) (newLocker, func(), error)
}

// newLocker returns a Locker of one client's factory with opts over the
// client's own (waiting). The Locker is also the factory's lock.Inspector.
type newLocker func(opts ...lock.Option) lock.Locker

type inspectLocker struct {
	lock.Locker
	lock.Inspector
}

func lockers(as func(...lock.Option) lock.Locker, in lock.Inspector, base ...lock.Option) newLocker {
	return func(opts ...lock.Option) lock.Locker { return inspectLocker{as(slices.Concat(base, opts)...), in} }
}

// sharedLocker is the readers' Locker of a client of b: nil unless b runs
// the shared workload.
func (b *backendDef) sharedLocker(mk newLocker) lock.Locker {
	if !b.mix {
		return nil
	}
	return mk(lock.WithShared())
}

// sharedDefs adds to bs, for each backend that honours WithShared, the
// same backend running the shared workload under the name
// "<name>-shared".
func sharedDefs(bs []*backendDef) []*backendDef {
	for _, b := range slices.Clone(bs) {
		if b.shared {
			s := *b
			s.name, s.mix = b.name+"-shared", true
			bs = append(bs, &s)
		}
	}
	return bs
}

func backendByName(name string) *backendDef {
	for _, b := range backends() {
		if b.name == name {
			return b
		}
	}
	return nil
}

func durEnv(getenv func(string) string, k string) time.Duration {
	d, _ := time.ParseDuration(getenv(k))
	return d
}

func backends() []*backendDef {
	return sharedDefs([]*backendDef{
		{
			name: "flock", class: kernelExclusion, shared: true,
			// "the kernel frees the lock at once; a waiter in another
			// process is woken by inotify"
			recover: 0,
			faults:  []string{fKill, fKill, fStop, fStopWait, fCancel, fCancel},
			stopFor: 500 * time.Millisecond,
			setup: func(r *run) error {
				r.env = append(r.env, "CHAOS_DIR="+r.mkdir("flock"))
				return nil
			},
			client: func(getenv func(string) string) (newLocker, func(), error) {
				f := flock.NewFactory(flock.WithDir(getenv("CHAOS_DIR")), flock.WithLogger(nil))
				return lockers(f.AsLocker, f, flock.WithWait()), func() { f.Close() }, nil
			},
		},
		{
			name: "filelock", class: leaseExclusion, ttl: time.Second, shared: true, guarded: true,
			// killed holder: reclaimed at once by the probe, waiters poll
			// (≤250ms); stopped holder: its lease (the stale window).
			recover: time.Second,
			faults:  []string{fKill, fKill, fStop, fStop, fStopWait, fCancel},
			stopFor: 1600 * time.Millisecond,
			setup: func(r *run) error {
				r.env = append(r.env, "CHAOS_DIR="+r.mkdir("filelock"), "CHAOS_TTL="+r.b.ttl.String())
				return nil
			},
			client: func(getenv func(string) string) (newLocker, func(), error) {
				f := filelock.NewFactory(filelock.WithDir(getenv("CHAOS_DIR")), filelock.WithTTL(durEnv(getenv, "CHAOS_TTL")), filelock.WithLogger(nil))
				return lockers(f.AsLocker, f, filelock.WithWait()), func() { f.Close() }, nil
			},
		},
		pgDef(),
		redisDef(),
		etcdDef(),
		{
			name: "memlock", class: leaseExclusion, inProcess: true, shared: true,
			recover: 0,
			faults:  []string{fLoss, fCancel},
			setup: func(r *run) error {
				f := memlock.NewFactory(memlock.WithLogger(nil))
				r.t.Cleanup(func() { f.Close() })
				r.inproc = func() (newLocker, func(), error) { return lockers(f.AsLocker, f, memlock.WithWait()), func() {}, nil }
				r.custom[fLoss] = func() fault {
					t := now()
					n := f.ForceLoss(r.name)
					return fault{kind: fLoss, start: t, end: t, detail: fmt.Sprintf("%d holder(s)", n)}
				}
				return nil
			},
		},
	})
}

// pglock's timing options for the run: short, so that losses are noticed
// and waiters retry within a second.
const (
	pgHealth    = 200 * time.Millisecond
	pgStatement = time.Second
	pgPoll      = 200 * time.Millisecond
)

func pgDef() *backendDef {
	return &backendDef{
		name: "pglock", class: sessionExclusion, shared: true,
		// A session that ended frees its locks at once; a waiter retries
		// within WithPollInterval; a stalled session is noticed within
		// WithHealthInterval + WithStatementTimeout and then closed.
		recover:  pgHealth + pgStatement + pgPoll,
		faults:   []string{fKill, fStop, fStopWait, fCancel, fTerminate, fTerminate, fDrop, fStall},
		stopFor:  500 * time.Millisecond,
		stallFor: 1500 * time.Millisecond,
		setup: func(r *run) error {
			testenv.SkipShort(r.t, "postgres")
			dsn := testenv.PostgresDSN()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			admin, err := pgxpool.New(ctx, dsn)
			if err == nil {
				err = admin.Ping(ctx)
			}
			if err != nil {
				if admin != nil {
					admin.Close()
				}
				return unavailable{"postgres", err}
			}
			r.t.Cleanup(admin.Close)
			cfg := admin.Config().ConnConfig
			p := startProxy(r.t, net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))))
			app := "chaos-" + r.id
			r.env = append(r.env, "CHAOS_PG_DSN="+dsn, "CHAOS_PROXY="+p.addr(), "CHAOS_PREFIX="+r.id, "CHAOS_APP="+app)
			r.custom[fDrop] = proxyDrop(p)
			r.custom[fStall] = proxyStall(p, r.b.stallFor)
			r.custom[fTerminate] = func() fault {
				c := r.pickHolder()
				t := now()
				var pid int
				if c != nil {
					pid = c.pgPID()
				}
				var n int
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				var err error
				// Only a lock session of this run is ever terminated: the
				// server is shared. The check is in the select list, which
				// is evaluated only for the row the WHERE clause chose (a
				// function call in WHERE may be evaluated for any row).
				if pid != 0 {
					err = admin.QueryRow(ctx, `SELECT count(*) FILTER (WHERE t) FROM (
						SELECT CASE WHEN application_name = $2 THEN pg_terminate_backend(pid) ELSE false END AS t
						FROM pg_stat_activity WHERE pid = $1 OFFSET 0) s`, pid, app).Scan(&n)
				} else {
					err = admin.QueryRow(ctx, `SELECT count(*) FILTER (WHERE t) FROM (
						SELECT pg_terminate_backend(pid) AS t FROM (
							SELECT pid FROM pg_stat_activity WHERE application_name = $1 ORDER BY random() LIMIT 1) c) s`, app).Scan(&n)
				}
				f := fault{kind: fTerminate, start: t, end: now(), detail: fmt.Sprintf("pid %d: %d terminated %v", pid, n, errString(err))}
				if err != nil {
					r.setupErr(fmt.Errorf("terminate: %w", err))
				}
				if c != nil {
					f.target, f.targetHeld = c.id, true
				}
				return f
			}
			return nil
		},
		client: func(getenv func(string) string) (newLocker, func(), error) {
			cfg, err := pgxpool.ParseConfig(getenv("CHAOS_PG_DSN"))
			if err != nil {
				return nil, nil, err
			}
			host, port, _ := net.SplitHostPort(getenv("CHAOS_PROXY"))
			pn, _ := strconv.Atoi(port)
			cfg.ConnConfig.Host, cfg.ConnConfig.Port, cfg.ConnConfig.Fallbacks = host, uint16(pn), nil
			cfg.ConnConfig.ConnectTimeout = 2 * time.Second
			cfg.MaxConns = 8
			pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
			if err != nil {
				return nil, nil, err
			}
			f := pglock.NewFactory(pool, pglock.WithKeyPrefix(getenv("CHAOS_PREFIX")), pglock.WithApplicationName(getenv("CHAOS_APP")),
				pglock.WithHealthInterval(pgHealth), pglock.WithStatementTimeout(pgStatement), pglock.WithPollInterval(pgPoll),
				pglock.WithConnectTimeout(2*time.Second), pglock.WithLogger(nil))
			return lockers(f.AsLocker, f, pglock.WithWait()), func() { f.Close(); pool.Close() }, nil
		},
	}
}

func redisDef() *backendDef {
	return &backendDef{
		name: "redislock", class: leaseExclusion, ttl: time.Second, shared: true, queueSeen: true,
		// "Process killed: its locks are freed when their keys expire,
		// within one TTL; waiters notice within the lease they were told
		// about." After a restart or a partition the same TTL bounds it.
		recover:  time.Second,
		faults:   []string{fKill, fStop, fStopWait, fCancel, fRestart, fDrop, fStall},
		stopFor:  1500 * time.Millisecond,
		stallFor: 1500 * time.Millisecond,
		setup: func(r *run) error {
			s, addr, err := startRedisServer(r.t, r.mkdir("redis"))
			if err != nil {
				return unavailable{"redis-server", err}
			}
			p := startProxy(r.t, addr)
			r.env = append(r.env, "CHAOS_ADDR="+p.addr(), "CHAOS_PREFIX=chaos-"+r.id+":", "CHAOS_TTL="+r.b.ttl.String())
			r.custom[fDrop] = proxyDrop(p)
			r.custom[fStall] = proxyStall(p, r.b.stallFor)
			r.custom[fRestart] = serverRestart(r, s)
			return nil
		},
		client: func(getenv func(string) string) (newLocker, func(), error) {
			rdb := redis.NewClient(&redis.Options{Addr: getenv("CHAOS_ADDR"), DialTimeout: time.Second})
			f := redislock.NewFactory(rdb, redislock.WithKeyPrefix(getenv("CHAOS_PREFIX")), redislock.WithTTL(durEnv(getenv, "CHAOS_TTL")), redislock.WithLogger(nil))
			return lockers(f.AsLocker, f, redislock.WithWait()), func() { f.Close(); rdb.Close() }, nil
		},
	}
}

func etcdDef() *backendDef {
	return &backendDef{
		name: "etcdlock", class: leaseExclusion, ttl: 2 * time.Second, shared: true, queueSeen: true,
		// "Process killed: its locks are freed when etcd expires its
		// lease, within one TTL (plus etcd's expiry check, ~0.5s)."
		recover:  2500 * time.Millisecond,
		faults:   []string{fKill, fStop, fStopWait, fCancel, fRestart, fDrop, fStall},
		stopFor:  3 * time.Second,
		stallFor: 3 * time.Second,
		setup: func(r *run) error {
			s, addr, err := startEtcdServer(r.t, r.mkdir("etcd"))
			if err != nil {
				return unavailable{"etcd", err}
			}
			p := startProxy(r.t, addr)
			r.env = append(r.env, "CHAOS_ADDR="+p.addr(), "CHAOS_PREFIX=chaos-"+r.id+"/", "CHAOS_TTL="+r.b.ttl.String())
			r.custom[fDrop] = proxyDrop(p)
			r.custom[fStall] = proxyStall(p, r.b.stallFor)
			r.custom[fRestart] = serverRestart(r, s)
			return nil
		},
		client: func(getenv func(string) string) (newLocker, func(), error) {
			cli, err := clientv3.New(clientv3.Config{
				Endpoints:   []string{getenv("CHAOS_ADDR")},
				DialTimeout: 3 * time.Second,
				Logger:      zap.NewNop(),
				// Reconnect quickly once the proxy or the server is back.
				DialOptions: []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
					Backoff:           backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.2, MaxDelay: 200 * time.Millisecond},
					MinConnectTimeout: time.Second,
				})},
			})
			if err != nil {
				return nil, nil, err
			}
			f := etcdlock.NewFactory(cli, etcdlock.WithKeyPrefix(getenv("CHAOS_PREFIX")), etcdlock.WithTTL(durEnv(getenv, "CHAOS_TTL")), etcdlock.WithLogger(nil))
			return lockers(f.AsLocker, f, etcdlock.WithWait()), func() { f.Close(); cli.Close() }, nil
		},
	}
}

func proxyDrop(p *proxy) func() fault {
	return func() fault {
		t := now()
		p.drop()
		return fault{kind: fDrop, start: t, end: now()}
	}
}

func proxyStall(p *proxy, d time.Duration) func() fault {
	return func() fault {
		t := now()
		p.stall(d)
		return fault{kind: fStall, start: t, end: now(), detail: d.String()}
	}
}

// serverRestart crashes the server and starts it again after a short
// outage; the fault ends when it answers again.
func serverRestart(r *run, s *server) func() fault {
	return func() fault {
		t := now()
		s.kill()
		time.Sleep(time.Duration(200+r.rng.IntN(600)) * time.Millisecond)
		err := s.start()
		return fault{kind: fRestart, start: t, end: now(), detail: errString(err)}
	}
}

// unavailable is the error of a setup that found no service.
type unavailable struct {
	service string
	err     error
}

func (u unavailable) Error() string { return u.service + ": " + u.err.Error() }
