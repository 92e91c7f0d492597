package redislock_test

// The users' code of the seed scenarios 4, 7, 9 and 12, as written there:
// it must keep compiling against this package.

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

// Scenario 4: long-running export with renewal.
func DailyPaymentsExport(ctx context.Context, rdb *redis.Client) error {
	locks := redislock.NewFactory(rdb,
		redislock.WithTTL(5*time.Minute),
		redislock.WithKeyPrefix("payments-export"),
	)

	holder, err := locks.Acquire(ctx, "daily-export")
	if errors.Is(err, redislock.ErrLocked) {
		slog.Info("daily export already running on another replica")
		return nil
	}
	if err != nil {
		return err
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
			case <-t.C:
				if err := holder.Extend(ctx); err != nil {
					slog.Error("lost lock — aborting export", "err", err)
					cancel()
					return
				}
			}
		}
	}()

	return seedRunExport(ctx)
}

func seedRunExport(context.Context) error { return nil }

// Scenario 7: fencing against a GC-pause split brain.
type seedStore struct{}

func (seedStore) Put(ctx context.Context, key string, data []byte, fence uint64) error { return nil }

func ExportPayments(ctx context.Context, locks *redislock.Factory, store seedStore) error {
	holder, err := locks.Acquire(ctx, "payments-export")
	if errors.Is(err, redislock.ErrLocked) {
		return nil
	}
	if err != nil {
		return err
	}
	defer holder.Release()

	fence := holder.Token()
	return store.Put(ctx, "payments/today.csv", []byte("data"), fence)
}

// Scenario 9: per-user serialization.
type RebuildHandler struct {
	locks *redislock.Factory
}

var ErrAlreadyInProgress = errors.New("rebuild already in progress")

func (h *RebuildHandler) Rebuild(ctx context.Context, userID string) error {
	lockName := fmt.Sprintf("rebuild-timeline:%s", userID)

	err := h.locks.WithLock(ctx, lockName, func(ctx context.Context) error {
		return nil
	}, redislock.WithTTL(2*time.Minute))

	if errors.Is(err, redislock.ErrLocked) {
		return ErrAlreadyInProgress
	}
	return err
}

// Scenario 12: the factory handed to a scheduler adapter as a lock.Locker.
func newSchedulerLocker(rdb *redis.Client) lock.Locker {
	locks := redislock.NewFactory(rdb, redislock.WithTTL(10*time.Minute))
	return locks.AsLocker()
}

// The clients users hold are accepted as they are.
var (
	_ = redislock.NewFactory((*redis.Client)(nil))
	_ = redislock.NewFactory((*redis.ClusterClient)(nil))
	_ = redislock.NewFactory(redis.UniversalClient(nil))
	_ = newSchedulerLocker
)
