package gocronlock_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/contrib/gocronlock"
	"github.com/ubgo/lock/redislock"
)

// The seed's scenario 12: every replica runs this scheduler; each tick of
// each job runs on one of them. (Compiled, not run: it needs Redis.)
func Example_redis() {
	newScheduler := func(rdb *redis.Client) (gocron.Scheduler, error) {
		locks := redislock.NewFactory(rdb, redislock.WithTTL(10*time.Minute))

		s, err := gocron.NewScheduler(
			gocron.WithDistributedLocker(gocronlock.New(locks.AsLocker())),
		)
		if err != nil {
			return nil, err
		}

		s.NewJob(
			gocron.DurationJob(time.Minute),
			gocron.NewTask(syncJob),
			gocron.WithName("sync-data"), // ALWAYS set — used as lock key
		)
		s.NewJob(
			gocron.CronJob("0 0 * * *", false),
			gocron.NewTask(processBilling),
			gocron.WithName("midnight-billing"),
			gocron.WithEventListeners(gocron.AfterLockError(func(_ uuid.UUID, job string, err error) {
				if !errors.Is(err, lock.ErrLocked) { // not just another replica's turn
					fmt.Println("lock backend failed:", job, err)
				}
			})),
		)
		return s, nil
	}
	_ = newScheduler
}

func syncJob(ctx context.Context) error {
	ctx, cancel := gocronlock.JobContext(ctx) // cancelled if the lock is lost
	defer cancel()
	_ = ctx
	return nil
}

func processBilling() {}
