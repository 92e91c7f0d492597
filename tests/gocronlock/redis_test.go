package gocronlock_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/contrib/gocronlock"
	"github.com/ubgo/lock/internal/testenv"
	"github.com/ubgo/lock/redislock"
)

// Redis joins the scheduler tests. Each replica gets its own client and
// factory, as separate processes would; they meet on the server under a
// key prefix no other test uses.
func init() {
	backends = append(backends, testBackend{name: "redis", fresh: redisBackend})
}

func redisBackend(t *testing.T) (func(...lock.Option) lock.Locker, func(string)) {
	t.Helper()
	probe := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr()})
	defer probe.Close()
	testenv.Need(t, "redis", func(ctx context.Context) error { return probe.Ping(ctx).Err() })
	var b [6]byte
	rand.Read(b[:])
	prefix := "gocronlock-test:" + hex.EncodeToString(b[:]) + ":"
	newLocker := func(opts ...lock.Option) lock.Locker {
		rdb := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr()})
		f := redislock.NewFactory(rdb, redislock.WithKeyPrefix(prefix), redislock.WithTTL(time.Second), redislock.WithLogger(nil))
		t.Cleanup(func() {
			f.Close()
			rdb.Close()
		})
		return f.AsLocker(opts...)
	}
	// lose takes every lock of the test away behind its holders' backs, as
	// an operator's DEL or a failover to a replica that missed the write
	// would; the holders find out when they next renew.
	lose := func(string) {
		rdb := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr()})
		defer rdb.Close()
		ctx := context.Background()
		keys, err := rdb.Keys(ctx, prefix+"*").Result()
		if err != nil {
			t.Errorf("KEYS: %v", err)
			return
		}
		if len(keys) > 0 {
			if err := rdb.Del(ctx, keys...).Err(); err != nil {
				t.Errorf("DEL: %v", err)
			}
		}
	}
	t.Cleanup(func() { lose("") })
	return newLocker, lose
}

// A Redis that cannot be reached is a failure, not contention, for the
// Locker and for the Elector.
func TestRedisDownIsNotContention(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	defer rdb.Close()
	f := redislock.NewFactory(rdb, redislock.WithLogger(nil))
	defer f.Close()
	l := gocronlock.New(f.AsLocker())
	defer l.Close()
	_, err := l.Lock(context.Background(), "job")
	if err == nil || errors.Is(err, lock.ErrLocked) {
		t.Fatalf("Lock with Redis down = %v, want a non-contention error", err)
	}
	t.Logf("Lock: %v", err)
	e := gocronlock.NewElector(f.AsLocker(), "leader", gocronlock.WithRetryInterval(50*time.Millisecond), gocronlock.WithLogger(nil))
	defer e.Close()
	waitFor(handoverBound, func() bool {
		err = e.IsLeader(context.Background())
		return errors.Is(err, gocronlock.ErrNotLeader) && !errors.Is(err, lock.ErrLocked) && err != gocronlock.ErrNotLeader
	})
	if !errors.Is(err, gocronlock.ErrNotLeader) || errors.Is(err, lock.ErrLocked) || err == gocronlock.ErrNotLeader {
		t.Fatalf("IsLeader with Redis down = %v", err)
	}
	t.Logf("IsLeader: %v", err)
}

// BenchmarkRedisLockUnlock is the adapter's cost per run on Redis, beside
// BenchmarkRedisFloor, redislock's own Acquire and Release of the same
// name through the same kind of lock.Locker.
func BenchmarkRedisLockUnlock(b *testing.B) {
	lk := benchRedis(b)
	l := gocronlock.New(lk, gocronlock.WithMinHold(0))
	ctx := context.Background()
	for b.Loop() {
		r, err := l.Lock(ctx, "job")
		if err != nil {
			b.Fatal(err)
		}
		if err := r.Unlock(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkRedisFloor(b *testing.B) {
	lk := benchRedis(b)
	ctx := context.Background()
	for b.Loop() {
		h, err := lk.Acquire(ctx, "gocron:job")
		if err != nil {
			b.Fatal(err)
		}
		if err := h.Release(); err != nil {
			b.Fatal(err)
		}
	}
}

func benchRedis(b *testing.B) lock.Locker {
	rdb := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr()})
	b.Cleanup(func() { rdb.Close() })
	testenv.Need(b, "redis", func(ctx context.Context) error { return rdb.Ping(ctx).Err() })
	var k [6]byte
	rand.Read(k[:])
	f := redislock.NewFactory(rdb, redislock.WithKeyPrefix("gocronlock-bench:"+hex.EncodeToString(k[:])+":"), redislock.WithLogger(nil))
	b.Cleanup(func() { f.Close() })
	return f.AsLocker()
}
