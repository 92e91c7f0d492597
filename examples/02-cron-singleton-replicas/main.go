// Command 02-cron-singleton-replicas is use case 2: a service runs in three
// replicas and an hourly cron fires on each of them; only one may do the
// hour's work.
//
// A lock alone keeps the replicas from aggregating the same hour at the same
// time, but a replica whose timer fires after the winner finished and
// released finds the lock free and would aggregate the hour again. So the
// job runs through lock.RunOncePer with a Ledger. Underneath, RunOncePer
// names the hour with lock.PeriodKey ("hourly-aggregate@2026-05-04T13:00:00Z",
// from the tick the cron was scheduled for, not time.Now(), so replicas
// whose timers fire a little apart agree) and calls lock.RunOnce, which
//
//  1. returns (false, nil) at once if the ledger already records the hour;
//  2. acquires the hour's lock — contention returns ErrLocked: another
//     replica is on it, and this one skips;
//  3. checks the ledger again under the lock (the winner may have finished
//     between 1 and 2);
//  4. runs the job with a context cancelled if the lock is lost;
//  5. records the hour in the ledger with the holder's fencing token, on a
//     context detached from the caller's, and releases.
//
// The ledger must live where every replica sees it: here, the backend's
// own durable ledger in the same service as the locks (pglock.NewLedger: a
// table; redislock.NewLedger: SET NX keys; etcdlock.NewLedger: keys created
// in a Txn only if absent). With no infrastructure the replicas are
// filelock factories of this process on one lock directory, and the ledger
// is filelock.NewLedger on the same directory (one file per record, linked
// into place only if absent).
//
//	go run ./02-cron-singleton-replicas                     # filelock, no infrastructure
//	go run ./02-cron-singleton-replicas -backend=postgres   # or redis, etcd
package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/examples/internal/replica"
)

// HourlyAggregate is the replica's cron handler for the hour tick: it
// aggregates unless another replica is doing, or has done, that hour.
func HourlyAggregate(ctx context.Context, locks lock.Locker, ledger lock.Ledger, tick time.Time,
	aggregate func(ctx context.Context, hour time.Time) error) (ran bool, err error) {
	ran, err = lock.RunOncePer(ctx, locks, ledger, "hourly-aggregate", time.Hour, tick,
		func(ctx context.Context) error { return aggregate(ctx, tick) })
	if errors.Is(err, lock.ErrLocked) {
		return false, nil // another replica is aggregating this hour right now
	}
	return ran, err
}

// config is the simulated fleet.
type config struct {
	Replicas int
	Hours    int           // hour ticks to simulate
	Jitter   time.Duration // how far apart the replicas' timers fire
	Work     time.Duration // how long one aggregation takes
}

// result says which replica aggregated each hour, and how often.
type result struct {
	Runs      map[time.Time][]int // hour → replicas that aggregated it
	LateSkips int                 // late replicas that found their hour done
}

// run fires every replica's cron for each hour, with jitter, then once more
// on one late replica after the hour's work was done.
func run(ctx context.Context, c *replica.Cluster, cfg config) (result, error) {
	type node struct {
		locks  lock.Locker
		ledger lock.Ledger
	}
	nodes := make([]node, cfg.Replicas)
	for i := range nodes {
		r, err := c.Replica(ctx, lock.WithOwner(fmt.Sprintf("replica-%d", i+1)))
		if err != nil {
			return result{}, err
		}
		nodes[i] = node{r.Locker(), c.Ledger(r)}
	}

	res := result{Runs: map[time.Time][]int{}}
	var mu sync.Mutex
	aggregate := func(i int) func(ctx context.Context, hour time.Time) error {
		return func(ctx context.Context, hour time.Time) error {
			mu.Lock()
			res.Runs[hour] = append(res.Runs[hour], i+1)
			mu.Unlock()
			fmt.Printf("replica-%d: aggregating %s\n", i+1, hour.Format(time.RFC3339))
			select {
			case <-time.After(cfg.Work):
				return nil
			case <-ctx.Done():
				return context.Cause(ctx)
			}
		}
	}

	first := time.Date(2026, 5, 4, 13, 0, 0, 0, time.UTC)
	for h := range cfg.Hours {
		tick := first.Add(time.Duration(h) * time.Hour)
		var wg sync.WaitGroup
		errs := make([]error, len(nodes))
		for i, n := range nodes {
			wg.Add(1)
			go func() {
				defer wg.Done()
				time.Sleep(rand.N(cfg.Jitter + 1))
				ran, err := HourlyAggregate(ctx, n.locks, n.ledger, tick, aggregate(i))
				if err == nil && !ran {
					fmt.Printf("replica-%d: %s taken by another replica, skipping\n", i+1, tick.Format("15:04"))
				}
				errs[i] = err
			}()
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			return res, err
		}
		// A replica whose timer was far behind fires after the work was
		// done and the lock released: the ledger, not the lock, stops it.
		late := h % len(nodes)
		ran, err := HourlyAggregate(ctx, nodes[late].locks, nodes[late].ledger, tick, aggregate(late))
		if err != nil {
			return res, err
		}
		if !ran {
			res.LateSkips++
			fmt.Printf("replica-%d (late): %s already aggregated, skipping\n", late+1, tick.Format("15:04"))
		}
	}
	return res, nil
}

func main() {
	replica.Main(demo, replica.Filelock, replica.Postgres, replica.Redis, replica.Etcd)
}

func demo(ctx context.Context, c *replica.Cluster) error {
	fmt.Printf("three replicas on %s, three hourly ticks\n", c.Backend)
	res, err := run(ctx, c, config{Replicas: 3, Hours: 3, Jitter: 20 * time.Millisecond, Work: 50 * time.Millisecond})
	if err != nil {
		return err
	}
	hours := slices.SortedFunc(maps.Keys(res.Runs), time.Time.Compare)
	for _, hour := range hours {
		fmt.Printf("%s aggregated %d time(s), by replica %v\n", hour.Format("15:04"), len(res.Runs[hour]), res.Runs[hour])
	}
	fmt.Printf("late replicas that found their hour already done: %d\n", res.LateSkips)
	return nil
}
