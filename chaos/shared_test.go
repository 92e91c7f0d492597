//go:build linux

package chaos

import (
	"context"
	"fmt"
	"sync"
	"testing"
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
	"github.com/ubgo/lock/memlock"
	"github.com/ubgo/lock/pglock"
	"github.com/ubgo/lock/redislock"
)

// The fuzz targets and regression tests use the shared services (those of
// scripts/services.sh, at testenv's endpoints), not servers of their own.

// acquirer is a backend factory seen through its common methods.
type acquirer struct {
	acquire func(ctx context.Context, name string, opts ...lock.Option) (lock.Holder, error)
	close   func() error
}

func wrap[H lock.Holder](acq func(context.Context, string, ...lock.Option) (H, error), close func() error) acquirer {
	return acquirer{
		acquire: func(ctx context.Context, name string, opts ...lock.Option) (lock.Holder, error) {
			h, err := acq(ctx, name, opts...)
			if err != nil {
				return nil, err
			}
			return h, nil
		},
		close: close,
	}
}

// shared holds the clients of the shared services, made once per test
// binary (the fuzz engine calls the targets many times).
var shared struct {
	mu   sync.Mutex
	pool *pgxpool.Pool
	rdb  *redis.Client
	etcd *clientv3.Client
	errs map[string]error
}

func sharedPool(t testing.TB) *pgxpool.Pool {
	testenv.SkipShort(t, "postgres")
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.pool == nil && shared.errs["postgres"] == nil {
		p, err := pgxpool.New(context.Background(), testenv.PostgresDSN())
		if err == nil {
			if err = testenv.Ping(context.Background(), p.Ping); err != nil {
				p.Close()
			}
		}
		if err != nil {
			setErr("postgres", err)
		} else {
			shared.pool = p
		}
	}
	if err := shared.errs["postgres"]; err != nil {
		testenv.Unavailable(t, "postgres", err)
	}
	return shared.pool
}

func sharedRedis(t testing.TB) *redis.Client {
	testenv.SkipShort(t, "redis")
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.rdb == nil && shared.errs["redis"] == nil {
		// A database of its own: the fuzz targets list the keys under
		// their prefix, which on a busy database 0 means scanning every
		// other test's keys.
		c := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr(), DB: 9})
		if err := testenv.Ping(context.Background(), func(ctx context.Context) error { return c.Ping(ctx).Err() }); err != nil {
			c.Close()
			setErr("redis", err)
		} else {
			shared.rdb = c
		}
	}
	if err := shared.errs["redis"]; err != nil {
		testenv.Unavailable(t, "redis", err)
	}
	return shared.rdb
}

func sharedEtcd(t testing.TB) *clientv3.Client {
	testenv.SkipShort(t, "etcd")
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.etcd == nil && shared.errs["etcd"] == nil {
		c, err := clientv3.New(clientv3.Config{Endpoints: testenv.EtcdEndpoints(), DialTimeout: 3 * time.Second, Logger: zap.NewNop()})
		if err == nil {
			err = testenv.Ping(context.Background(), func(ctx context.Context) error {
				_, err := c.Get(ctx, "chaos-probe")
				return err
			})
			if err != nil {
				c.Close()
			}
		}
		if err != nil {
			setErr("etcd", err)
		} else {
			shared.etcd = c
		}
	}
	if err := shared.errs["etcd"]; err != nil {
		testenv.Unavailable(t, "etcd", err)
	}
	return shared.etcd
}

func setErr(service string, err error) {
	if shared.errs == nil {
		shared.errs = map[string]error{}
	}
	shared.errs[service] = err
}

var backendNames = []string{"memlock", "flock", "filelock", "pglock", "redislock", "etcdlock"}

// newFactory makes a factory of backend with opts; dir is the directory of
// the file backends, prefix the key prefix of the network ones (appended
// after opts, so a fuzzed WithDir or WithKeyPrefix is overridden only when
// keep is false).
func newFactory(t testing.TB, backend string, opts ...lock.Option) acquirer {
	t.Helper()
	opts = append([]lock.Option{lock.WithLogger(nil)}, opts...)
	switch backend {
	case "memlock":
		f := memlock.NewFactory(opts...)
		return wrap(f.Acquire, f.Close)
	case "flock":
		f := flock.NewFactory(opts...)
		return wrap(f.Acquire, f.Close)
	case "filelock":
		f := filelock.NewFactory(opts...)
		return wrap(f.Acquire, f.Close)
	case "pglock":
		f := pglock.NewFactory(sharedPool(t), opts...)
		return wrap(f.Acquire, f.Close)
	case "redislock":
		f := redislock.NewFactory(sharedRedis(t), opts...)
		return wrap(f.Acquire, f.Close)
	case "etcdlock":
		f := etcdlock.NewFactory(sharedEtcd(t), opts...)
		return wrap(f.Acquire, f.Close)
	}
	panic(fmt.Sprintf("unknown backend %q", backend))
}

// scope returns the options that put backend's storage in a place of the
// test's own: a temp dir, or a unique key prefix.
func scope(t testing.TB, backend string) []lock.Option {
	switch backend {
	case "flock", "filelock":
		return []lock.Option{lock.WithDir(t.TempDir())}
	case "pglock", "redislock", "etcdlock":
		return []lock.Option{lock.WithKeyPrefix(fmt.Sprintf("chaos-%x/", time.Now().UnixNano()))}
	}
	return nil
}
