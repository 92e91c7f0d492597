package redislock_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/ubgo/lock"
	"github.com/ubgo/lock/redislock"
)

// A long job with a short crash-recovery window: the lock is taken with a
// 5-minute lease and extended by hand every 2 minutes. (Use WithLock, or
// WithAutoRenew(true), to have the factory renew it instead.)
func ExampleHolder_Extend() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	locks := redislock.NewFactory(rdb,
		redislock.WithTTL(5*time.Minute),
		redislock.WithKeyPrefix("payments-export:"),
	)
	defer locks.Close()

	holder, err := locks.Acquire(ctx, "daily-export")
	if errors.Is(err, redislock.ErrLocked) {
		slog.Info("daily export already running on another replica")
		return
	}
	if err != nil {
		slog.Error("acquire", "err", err)
		return
	}
	defer holder.Release()

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		t := time.NewTicker(2 * time.Minute)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-holder.Done(): // lost: the lease ran out before an Extend
				cancel()
				return
			case <-t.C:
				if err := holder.Extend(ctx); err != nil {
					slog.Error("lost lock, aborting export", "err", err)
					cancel()
					return
				}
			}
		}
	}()
	runExport(ctx)
}

func runExport(context.Context) {}

// Per-user serialization: the lease renews while the rebuild runs, and its
// context is cancelled if the lock is lost.
func ExampleFactory_WithLock() {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	locks := redislock.NewFactory(rdb)
	userID := "alice"

	err := locks.WithLock(context.Background(), "rebuild-timeline:"+userID, func(ctx context.Context) error {
		return nil // rebuild the timeline, watching ctx
	}, redislock.WithTTL(2*time.Minute))
	if errors.Is(err, redislock.ErrLocked) {
		fmt.Println("a rebuild is already in progress")
	}
}

// A fencing token goes with every write, so that the store can reject a
// holder that was paused past its lease.
func ExampleHolder_Token() {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	locks := redislock.NewFactory(rdb)
	holder, err := locks.Acquire(context.Background(), "payments-export")
	if err != nil {
		return
	}
	defer holder.Release()
	fmt.Println("writing with fence", holder.Token())
}

// At most three indexers at once, waiting for a free permit.
func ExampleWithMaxConcurrent() {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	locks := redislock.NewFactory(rdb)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := locks.WithLock(ctx, "indexer", func(ctx context.Context) error {
		return nil // index one batch
	}, redislock.WithMaxConcurrent(3), redislock.WithWait())
	if errors.Is(err, context.DeadlineExceeded) {
		fmt.Println("no permit within a minute")
	}
}

// Requests read the schema shared, the migration takes it exclusively:
// it waits for the readers in flight, and readers that come meanwhile
// wait behind it (writer preference).
func ExampleWithShared() {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	locks := redislock.NewFactory(rdb)
	ctx := context.Background()
	_ = locks.WithLock(ctx, "schema", func(ctx context.Context) error {
		return nil // serve a request that reads the schema
	}, redislock.WithShared(), redislock.WithWait())
	_ = locks.WithLock(ctx, "schema", func(ctx context.Context) error {
		return nil // migrate
	}, redislock.WithWait())
}

// Who holds a name, for operators.
func ExampleFactory_Inspect() {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	locks := redislock.NewFactory(rdb)
	info, err := locks.Inspect(context.Background(), "daily-export")
	if err != nil {
		return
	}
	for _, h := range info.Holders {
		fmt.Println(h.Owner, h.Token, time.Until(h.Expires).Round(time.Second))
	}
}

// Any code written against lock.Locker (a scheduler adapter, a library)
// takes the factory through AsLocker; its holders still have Extend.
func ExampleFactory_AsLocker() {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	var l lock.Locker = redislock.NewFactory(rdb, redislock.WithTTL(10*time.Minute)).AsLocker()
	h, err := l.Acquire(context.Background(), "sync-data")
	if err != nil {
		return
	}
	defer h.Release()
	if e, ok := h.(lock.Extender); ok {
		e.Extend(context.Background())
	}
}

// Bad input is an error, never a panic or a key without expiry.
func ExampleNewFactory() {
	_, err := redislock.NewFactory(nil).Acquire(context.Background(), "job")
	fmt.Println(errors.Is(err, lock.ErrInvalidOption))

	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	_, err = redislock.NewFactory(rdb, redislock.WithTTL(time.Millisecond)).Acquire(context.Background(), "job")
	fmt.Println(errors.Is(err, lock.ErrInvalidOption))
	// Output:
	// true
	// true
}
