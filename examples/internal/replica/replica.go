// Package replica is the examples' plumbing: it starts the simulated
// replicas of one run on the backend chosen with -backend, so that each
// example's main.go shows only the locking code a user would write.
//
// A replica is what one process of a real deployment owns: its own client
// (a Redis client, a pgx pool, an etcd client) and its own factory. Every
// replica of a [Cluster] contends on the same store — one directory for the
// file backends, one server under a key prefix unique to the run for the
// network backends — so a run never sees the locks or records of an earlier
// one.
package replica

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/etcdlock"
	"github.com/ubgo/lock/filelock"
	"github.com/ubgo/lock/flock"
	"github.com/ubgo/lock/internal/testenv"
	"github.com/ubgo/lock/pglock"
	"github.com/ubgo/lock/redislock"
)

// The backends an example can run on.
const (
	Flock    = "flock"    // kernel file locks in a directory; no infrastructure
	Filelock = "filelock" // marker files in a directory; no infrastructure
	Postgres = "postgres" // pglock on LOCK_TEST_POSTGRES_DSN
	Redis    = "redis"    // redislock on LOCK_TEST_REDIS_ADDR
	Etcd     = "etcd"     // etcdlock on LOCK_TEST_ETCD_ENDPOINTS
)

// EnvBackend is the environment variable that chooses the backend when
// -backend is not given. "real" means the backend the scenario names.
const EnvBackend = "LOCK_EXAMPLES_BACKEND"

// ErrUnavailable is returned by Open when the backend's service cannot be
// reached.
var ErrUnavailable = errors.New("service unavailable")

// Flag registers -backend: zero is the default (it needs no
// infrastructure), real is what "-backend=real" means, and a value outside
// zero, real and also is refused. Call the returned function after
// flag.Parse.
func Flag(zero, real string, also ...string) func() (string, error) {
	dflt := os.Getenv(EnvBackend)
	if dflt == "" {
		dflt = zero
	}
	allowed := append([]string{zero, real}, also...)
	usage := fmt.Sprintf("backend to run on: %s (no infrastructure)", zero)
	if real != zero {
		usage += fmt.Sprintf("; %s or \"real\" (the scenario's backend)", real)
	}
	if len(also) > 0 {
		usage += "; also " + strings.Join(also, ", ")
	}
	usage += "; the default comes from $" + EnvBackend + " if set"
	name := flag.String("backend", dflt, usage)
	return func() (string, error) {
		b := *name
		if b == "real" {
			b = real
		}
		if !slices.Contains(allowed, b) {
			return "", fmt.Errorf("backend %q: this example runs on %s", b, strings.Join(slices.Compact(allowed), ", "))
		}
		return b, nil
	}
}

// Main is the main of an example that runs on a Cluster: it registers
// -backend (zero, real and also as for Flag), parses the flags, opens the
// cluster of the chosen backend and runs demo on it, and exits with demo's
// error. A demo never hangs: everything it waits for ends with the
// one-minute ctx it gets.
func Main(demo func(ctx context.Context, c *Cluster) error, zero, real string, also ...string) {
	backend := Flag(zero, real, also...)
	flag.Parse()
	if err := runDemo(backend, demo); err != nil {
		log.Fatal(err)
	}
}

func runDemo(backend func() (string, error), demo func(ctx context.Context, c *Cluster) error) error {
	b, err := backend()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := Open(ctx, b, "")
	if err != nil {
		return err
	}
	defer c.Close()
	return demo(ctx, c)
}

// Service is the name of the service backend needs, "" for none.
func Service(backend string) string {
	switch backend {
	case Postgres, Redis, Etcd:
		return backend
	}
	return ""
}

// A Factory is what every backend's factory has in common.
type Factory interface {
	AsLocker(opts ...lock.Option) lock.Locker
	Inspect(ctx context.Context, name string) (lock.Info, error)
	Close() error
}

// A Cluster is the fleet of one run.
type Cluster struct {
	Backend string
	Dir     string // the lock directory of the file backends
	Prefix  string // the key prefix of the network backends, unique to the run

	removeDir bool
	ledger    *lock.MemoryLedger

	mu       sync.Mutex
	replicas []*Replica
}

// Open prepares a run on backend. For the file backends dir is the lock
// directory; "" makes a temporary one that Close removes. For a network
// backend Open checks that its service answers, and returns an error
// matching ErrUnavailable if it does not.
func Open(ctx context.Context, backend, dir string) (*Cluster, error) {
	c := &Cluster{Backend: backend, Dir: dir, ledger: lock.NewMemoryLedger()}
	var id [6]byte
	rand.Read(id[:])
	run := hex.EncodeToString(id[:])
	switch backend {
	case Flock, Filelock:
		if dir == "" {
			d, err := os.MkdirTemp("", "ubgo-lock-example-")
			if err != nil {
				return nil, err
			}
			c.Dir, c.removeDir = d, true
		}
		return c, nil
	case Postgres:
		c.Prefix = "examples/" + run + "/"
	case Redis:
		c.Prefix = "examples:" + run + ":"
	case Etcd:
		c.Prefix = "ubgo-lock-examples/" + run + "/"
	default:
		return nil, fmt.Errorf("unknown backend %q", backend)
	}
	// One replica that connects proves the service is there.
	r, err := c.Replica(ctx)
	if err != nil {
		return nil, err
	}
	return c, r.Close()
}

// Replica starts one replica: a new client of the cluster's store and a
// factory on it, with opts as the factory's defaults.
func (c *Cluster) Replica(ctx context.Context, opts ...lock.Option) (*Replica, error) {
	r := &Replica{Backend: c.Backend, cluster: c}
	switch c.Backend {
	case Flock:
		r.Factory = flock.NewFactory(append([]lock.Option{flock.WithDir(c.Dir)}, opts...)...)
	case Filelock:
		r.Factory = filelock.NewFactory(append([]lock.Option{filelock.WithDir(c.Dir)}, opts...)...)
	case Postgres:
		pool, err := pgxpool.New(ctx, testenv.PostgresDSN())
		if err == nil {
			err = testenv.Ping(ctx, pool.Ping)
		}
		if err != nil {
			if pool != nil {
				pool.Close()
			}
			return nil, fmt.Errorf("%w: postgres at %s: %w", ErrUnavailable, testenv.PostgresDSN(), err)
		}
		r.Postgres = pool
		r.Factory = pglock.NewFactory(pool, append([]lock.Option{pglock.WithKeyPrefix(c.Prefix)}, opts...)...)
	case Redis:
		rdb := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr()})
		if err := testenv.Ping(ctx, func(ctx context.Context) error { return rdb.Ping(ctx).Err() }); err != nil {
			rdb.Close()
			return nil, fmt.Errorf("%w: redis at %s: %w", ErrUnavailable, testenv.RedisAddr(), err)
		}
		r.Redis = rdb
		r.Factory = redislock.NewFactory(rdb, append([]lock.Option{redislock.WithKeyPrefix(c.Prefix)}, opts...)...)
	case Etcd:
		cli, err := clientv3.New(clientv3.Config{Endpoints: testenv.EtcdEndpoints(), DialTimeout: 2 * time.Second, Logger: quietZap})
		if err == nil {
			err = testenv.Ping(ctx, func(ctx context.Context) error { _, err := cli.Get(ctx, "health"); return err })
			if err != nil {
				cli.Close()
			}
		}
		if err != nil {
			return nil, fmt.Errorf("%w: etcd at %v: %w", ErrUnavailable, testenv.EtcdEndpoints(), err)
		}
		r.Etcd = cli
		r.Factory = etcdlock.NewFactory(cli, append([]lock.Option{etcdlock.WithKeyPrefix(c.Prefix)}, opts...)...)
	default:
		return nil, fmt.Errorf("unknown backend %q", c.Backend)
	}
	c.mu.Lock()
	c.replicas = append(c.replicas, r)
	c.mu.Unlock()
	return r, nil
}

// quietZap keeps the etcd client from logging its reconnects after a
// replica crashed on purpose.
var quietZap = zap.NewNop()

// Ledger returns the record of completed work that replica r sees, kept
// where every replica of the run sees it: the backend's own durable ledger
// (a Postgres table, Redis keys, etcd keys, files in the lock directory)
// under the run's prefix or directory. flock has none; its replicas live in
// this process and share an in-memory ledger.
func (c *Cluster) Ledger(r *Replica) lock.Ledger {
	switch c.Backend {
	case Postgres:
		return pglock.NewLedger(r.Postgres, pglock.WithKeyPrefix(c.Prefix))
	case Redis:
		return redislock.NewLedger(r.Redis, redislock.WithKeyPrefix(c.Prefix))
	case Etcd:
		return etcdlock.NewLedger(r.Etcd, etcdlock.WithKeyPrefix(c.Prefix))
	case Filelock:
		return filelock.NewLedger(filelock.WithDir(c.Dir))
	}
	return c.ledger
}

// Close closes every replica still open, then removes what the run left
// in the store: the temporary directory, or the keys and ledger records
// under the run's prefix.
func (c *Cluster) Close() error {
	c.mu.Lock()
	rs := c.replicas
	c.replicas = nil
	c.mu.Unlock()
	var errs []error
	for _, r := range rs {
		errs = append(errs, r.Close())
	}
	if c.removeDir {
		errs = append(errs, os.RemoveAll(c.Dir))
	}
	if c.Prefix != "" {
		errs = append(errs, c.cleanup())
	}
	return errors.Join(errs...)
}

func (c *Cluster) cleanup() error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := c.Replica(ctx)
	if err != nil {
		return err
	}
	defer r.Close()
	switch {
	case r.Postgres != nil:
		// pglock's ledger, fence and semaphore-limit rows (its holders'
		// rows go when their sessions end).
		for _, table := range []string{"pglock_ledger", "pglock_fences", "pglock_limits"} {
			if err == nil {
				_, err = r.Postgres.Exec(ctx, `DO $$ BEGIN
					IF to_regclass('`+table+`') IS NOT NULL THEN
						DELETE FROM `+table+` WHERE ns = '`+c.Prefix+`';
					END IF; END $$`)
			}
		}
	case r.Redis != nil:
		iter := r.Redis.Scan(ctx, 0, c.Prefix+"*", 1000).Iterator()
		for err == nil && iter.Next(ctx) {
			err = r.Redis.Del(ctx, iter.Val()).Err()
		}
		if err == nil {
			err = iter.Err()
		}
	case r.Etcd != nil:
		_, err = r.Etcd.Delete(ctx, c.Prefix, clientv3.WithPrefix())
	}
	if err != nil {
		return fmt.Errorf("removing the run's records under %q: %w", c.Prefix, err)
	}
	return nil
}

// A Replica is one simulated process: its client and its factory.
type Replica struct {
	Backend string
	Factory Factory

	Postgres *pgxpool.Pool    // set on Postgres
	Redis    *redis.Client    // set on Redis
	Etcd     *clientv3.Client // set on Etcd

	cluster *Cluster
	once    sync.Once
	crashed bool
	err     error
}

// Locker returns a Locker of this replica's factory with opts (the
// factory's AsLocker: leases renew in the background).
func (r *Replica) Locker(opts ...lock.Option) lock.Locker { return r.Factory.AsLocker(opts...) }

// Crash ends the replica as a process that dies would: nothing is released
// by the replica itself; the store frees its locks the way it frees a dead
// process's. For flock and Postgres that is at once (the kernel closes the
// files; the server ends the sessions), which closing the factory does
// here. filelock reclaims a dead holder on this host at once through its
// process probe; the replicas share this process, so closing the factory,
// which removes its markers, stands in for it. Redis and etcd keep the
// locks until their lease runs out: the client is closed, its factory can
// no longer renew, and the server expires the keys after the TTL.
func (r *Replica) Crash() {
	switch r.Backend {
	case Redis:
		r.Redis.Close()
	case Etcd:
		r.Etcd.Close()
	default:
		r.Factory.Close()
	}
	r.crashed = true
}

// Close closes the factory (releasing what it holds) and the client.
func (r *Replica) Close() error {
	r.once.Do(func() {
		ferr := r.Factory.Close()
		if r.crashed {
			ferr = nil // the client is gone; the server frees what is left
		}
		var cerr error
		switch {
		case r.Postgres != nil:
			r.Postgres.Close()
		case r.Redis != nil:
			if cerr = r.Redis.Close(); errors.Is(cerr, redis.ErrClosed) {
				cerr = nil
			}
		case r.Etcd != nil:
			if cerr = r.Etcd.Close(); r.crashed {
				cerr = nil
			}
		}
		r.err = errors.Join(ferr, cerr)
	})
	return r.err
}
