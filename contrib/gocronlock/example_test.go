package gocronlock_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/google/uuid"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/contrib/gocronlock"
	"github.com/ubgo/lock/memlock"
)

// Two replicas share one backend (memlock here; redislock, pglock or
// etcdlock in production, as in tests/gocronlock's Example_redis). The job
// runs on one of them.
func Example() {
	locks := memlock.NewFactory()
	defer locks.Close()

	ran := make(chan string, 2)
	skipped := make(chan error, 2)
	var scheds []gocron.Scheduler
	for _, replica := range []string{"a", "b"} {
		l := gocronlock.New(locks.AsLocker())
		defer l.Close()
		s, err := gocron.NewScheduler(gocron.WithDistributedLocker(l))
		if err != nil {
			panic(err)
		}
		_, err = s.NewJob(
			gocron.OneTimeJob(gocron.OneTimeJobStartImmediately()),
			gocron.NewTask(func(ctx context.Context) {
				ctx, cancel := gocronlock.JobContext(ctx) // cancelled if the lock is lost
				defer cancel()
				_ = ctx
				ran <- replica
			}),
			gocron.WithName("sync-data"), // ALWAYS set: it is the lock key
			gocron.WithEventListeners(gocron.AfterLockError(func(_ uuid.UUID, _ string, err error) {
				skipped <- err
			})),
		)
		if err != nil {
			panic(err)
		}
		scheds = append(scheds, s)
	}
	for _, s := range scheds {
		s.Start()
	}
	<-ran
	err := <-skipped
	fmt.Println("other replica skipped:", errors.Is(err, lock.ErrLocked))
	for _, s := range scheds {
		_ = s.Shutdown()
	}
	// Output:
	// other replica skipped: true
}

// One replica at a time runs every job: the one whose Elector holds the
// "billing-scheduler" lock.
func ExampleNewElector() {
	locks := memlock.NewFactory()
	defer locks.Close()

	el := gocronlock.NewElector(locks.AsLocker(), "billing-scheduler", gocronlock.WithTakeoverDelay(0))
	defer el.Close()
	s, err := gocron.NewScheduler(gocron.WithDistributedElector(el))
	if err != nil {
		panic(err)
	}
	defer s.Shutdown()

	for el.IsLeader(context.Background()) != nil {
		time.Sleep(10 * time.Millisecond)
	}
	fmt.Println("leader, epoch", el.Holder().Token())
	// Output:
	// leader, epoch 1
}
