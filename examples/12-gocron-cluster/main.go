// Command 12-gocron-cluster is use case 12: a service schedules its jobs
// with gocron v2 and runs in three replicas; each job's interval must run
// on one replica, not on all three.
//
// The scheduler gets a gocronlock.Locker over any family backend
// (gocron.WithDistributedLocker(gocronlock.New(locks.AsLocker())), default
// options). When a job's timer fires, gocron calls Lock(ctx, jobName) and
// runs the job only on the replica whose Lock succeeded; the others' Lock
// returns an error matching lock.ErrLocked and they skip the tick.
// Underneath, gocronlock acquires "gocron:<job name>" from the backend's
// Locker (whose lease renews while the job runs, so a job may outlast the
// TTL) and keeps it after the run for the job's next tick on that
// replica, which runs on it: the replica that ran a job first keeps running
// it while it lives. That is what makes an interval run once:
// a DurationJob's phase is set by each scheduler's start, so replicas
// deployed apart fire anywhere in the interval, and a lock released the
// moment a 20ms job ended would let each of them run it again. Every job
// needs gocron.WithName: it is the lock key, and gocronlock refuses the
// function-derived names gocron gives unnamed jobs.
//
// The demo starts three schedulers a third of the interval apart, as a
// rolling deploy does (0, 100 and 200ms, a job every 300ms), and counts
// which replica ran each tick.
//
//	go run ./12-gocron-cluster                  # filelock, no infrastructure
//	go run ./12-gocron-cluster -backend=redis   # or postgres, etcd
package main

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/google/uuid"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/contrib/gocronlock"
	"github.com/ubgo/lock/examples/internal/replica"
)

// NewScheduler is a replica's scheduler: syncJob every syncEvery and the
// midnight billing, each run on one replica per tick. locks is the
// replica's Locker (a factory's AsLocker(), not waiting); lockError hears
// every tick this replica skipped and why.
func NewScheduler(locks lock.Locker, syncEvery time.Duration,
	syncJob, processBilling func(ctx context.Context) error,
	lockError func(job string, err error)) (gocron.Scheduler, *gocronlock.Locker, error) {
	cluster := gocronlock.New(locks)
	if err := cluster.Err(); err != nil { // a misconfigured Locker would skip every tick
		return nil, nil, err
	}
	s, err := gocron.NewScheduler(gocron.WithDistributedLocker(cluster))
	if err != nil {
		return nil, nil, err
	}
	listener := gocron.WithEventListeners(gocron.AfterLockError(func(_ uuid.UUID, job string, err error) {
		lockError(job, err)
	}))
	if _, err := s.NewJob(
		gocron.DurationJob(syncEvery),
		gocron.NewTask(syncJob),
		gocron.WithName("sync-data"), // ALWAYS set: it is the lock key
		listener,
	); err != nil {
		return nil, nil, err
	}
	if _, err := s.NewJob(
		gocron.CronJob("0 0 * * *", false),
		gocron.NewTask(processBilling),
		gocron.WithName("midnight-billing"),
		listener,
	); err != nil {
		return nil, nil, err
	}
	return s, cluster, nil
}

// config sizes the demo.
type config struct {
	Skews    []time.Duration // when each replica starts, after the first
	Interval time.Duration
	Ticks    int // ticks every replica fires for
	Work     time.Duration
}

// result: which replicas ran each tick, and why the others skipped.
type result struct {
	Runs     map[int][]int // tick → replicas that ran it
	Fires    []int         // ticks each replica fired for (ran or skipped)
	LockErrs []error       // every Lock error
}

func run(ctx context.Context, c *replica.Cluster, cfg config) (res result, err error) {
	res = result{Runs: map[int][]int{}, Fires: make([]int, len(cfg.Skews))}
	var mu sync.Mutex
	start := time.Now().Add(200 * time.Millisecond)
	tickOf := func(t time.Time) int { return int((t.Sub(start) + cfg.Interval/2) / cfg.Interval) }
	fired := make(chan struct{}, 1)
	fire := func(i int) {
		res.Fires[i]++
		select {
		case fired <- struct{}{}:
		default:
		}
	}

	var scheds []gocron.Scheduler
	var lockers []*gocronlock.Locker
	defer func() {
		for _, s := range scheds {
			s.Shutdown()
		}
		for _, l := range lockers {
			l.Close()
		}
	}()
	for i := range cfg.Skews {
		r, err := c.Replica(ctx, lock.WithTTL(10*time.Minute), lock.WithOwner(fmt.Sprintf("replica-%d", i+1)))
		if err != nil {
			return res, err
		}
		syncJob := func(ctx context.Context) error {
			tick := tickOf(time.Now())
			fence := gocronlock.JobHolder(ctx).Token()
			mu.Lock()
			res.Runs[tick] = append(res.Runs[tick], i+1)
			fire(i)
			mu.Unlock()
			fmt.Printf("replica-%d: sync-data, tick %d (fence %d)\n", i+1, tick, fence)
			time.Sleep(cfg.Work)
			return nil
		}
		billing := func(ctx context.Context) error { return nil }
		lockError := func(job string, err error) {
			mu.Lock()
			defer mu.Unlock()
			res.LockErrs = append(res.LockErrs, err)
			if job == "sync-data" {
				fire(i)
			}
		}
		s, l, err := NewScheduler(r.Locker(), cfg.Interval, syncJob, billing, lockError)
		if err != nil {
			return res, err
		}
		scheds, lockers = append(scheds, s), append(lockers, l)
	}
	// Replicas start apart: their ticks fire as far apart as they started.
	for i, s := range scheds {
		time.Sleep(time.Until(start.Add(cfg.Skews[i])))
		s.Start()
	}
	for {
		mu.Lock()
		done := true
		for _, n := range res.Fires {
			done = done && n >= cfg.Ticks
		}
		mu.Unlock()
		if done {
			break
		}
		select {
		case <-fired:
		case <-ctx.Done():
			return res, fmt.Errorf("replicas fired %v ticks: %w", res.Fires, ctx.Err())
		}
	}
	for _, s := range scheds {
		if err := s.Shutdown(); err != nil {
			return res, err
		}
	}
	mu.Lock()
	defer mu.Unlock()
	return res, nil
}

func main() {
	replica.Main(demo, replica.Filelock, replica.Redis, replica.Postgres, replica.Etcd)
}

func demo(ctx context.Context, c *replica.Cluster) error {
	res, err := run(ctx, c, config{
		Skews:    []time.Duration{0, 100 * time.Millisecond, 200 * time.Millisecond},
		Interval: 300 * time.Millisecond, Ticks: 5, Work: 20 * time.Millisecond,
	})
	if err != nil {
		return err
	}
	ticks := make([]int, 0, len(res.Runs))
	for t := range res.Runs {
		ticks = append(ticks, t)
	}
	sort.Ints(ticks)
	for _, t := range ticks {
		fmt.Printf("tick %d ran on replica %v\n", t, res.Runs[t])
	}
	skipped := 0
	for _, err := range res.LockErrs {
		if errors.Is(err, lock.ErrLocked) {
			skipped++
		}
	}
	fmt.Printf("%d ticks skipped because another replica had them\n", skipped)
	return nil
}
