package gocronlock_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/google/uuid"
	"github.com/jonboulle/clockwork"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/contrib/gocronlock"
	"github.com/ubgo/lock/memlock"
)

// A testBackend is one lock backend the scheduler tests run against. fresh
// gives a test a store no other test uses; each call of its newLocker
// returns a lock.Locker on that store, as each replica of one deployment
// would have, and lose takes a lock away from its holder.
type testBackend struct {
	name  string
	fresh func(t *testing.T) (newLocker func(opts ...lock.Option) lock.Locker, lose func(name string))
	// syncLoss: lose takes effect before it returns and gives the lock
	// to the first waiter (memlock's ForceLoss). Elsewhere the holder
	// notices at its next renewal, and may win the free lock back.
	syncLoss bool
}

// backends lists what the scheduler tests run on; redis_test.go adds Redis.
var backends = []testBackend{{name: "memlock", fresh: func(t *testing.T) (func(...lock.Option) lock.Locker, func(string)) {
	f := memlock.NewFactory()
	t.Cleanup(func() { f.Close() })
	return func(opts ...lock.Option) lock.Locker { return f.AsLocker(opts...) },
		func(name string) { f.ForceLoss(name) }
}, syncLoss: true}}

// skewedClock is a replica's wall clock, off behind the real one: its cron
// timers fire off late. Timers themselves run in real time.
type skewedClock struct {
	clockwork.Clock
	off time.Duration
}

func (c skewedClock) Now() time.Time                  { return c.Clock.Now().Add(-c.off) }
func (c skewedClock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }
func (c skewedClock) Until(t time.Time) time.Duration { return t.Sub(c.Now()) }

// tally counts runs per job and tick, and which replicas ran them.
type tally struct {
	mu   sync.Mutex
	base time.Time                  // tick 0 of duration jobs
	runs map[string]map[int64][]int // job -> tick -> replicas that ran it
	errs map[string][]error         // job -> AfterLockError errors
	// stopping is set when the cluster starts shutting down: gocron then
	// cancels the context of lock attempts in flight, which is no error.
	stopping bool
}

func newTally(base time.Time) *tally {
	return &tally{base: base, runs: map[string]map[int64][]int{}, errs: map[string][]error{}}
}

// cronTick is the whole second nearest to t, as a Unix time.
func cronTick(t time.Time) int64 { return t.Round(time.Second).Unix() }

// durTick is the number of whole seconds from base nearest to t.
func (c *tally) durTick(t time.Time) int64 {
	return int64(math.Round(t.Sub(c.base).Seconds()))
}

func (c *tally) ran(job string, tick int64, replica int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.runs[job] == nil {
		c.runs[job] = map[int64][]int{}
	}
	c.runs[job][tick] = append(c.runs[job][tick], replica)
}

func (c *tally) lockErr(job string, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopping && errors.Is(err, context.Canceled) {
		return
	}
	c.errs[job] = append(c.errs[job], err)
}

// counts returns the number of runs of job at each tick from..to.
func (c *tally) counts(job string, from, to int64) []int {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []int
	for k := from; k <= to; k++ {
		out = append(out, len(c.runs[job][k]))
	}
	return out
}

// report renders the runs of job, for the test log.
func (c *tally) report(job string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var ticks []int64
	for k := range c.runs[job] {
		ticks = append(ticks, k)
	}
	sort.Slice(ticks, func(i, j int) bool { return ticks[i] < ticks[j] })
	var b strings.Builder
	for _, k := range ticks {
		fmt.Fprintf(&b, " %d:%d%v", k, len(c.runs[job][k]), c.runs[job][k])
	}
	return b.String()
}

// maxRuns is the largest number of runs any single tick of job had.
func (c *tally) maxRuns(job string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	m := 0
	for _, rs := range c.runs[job] {
		m = max(m, len(rs))
	}
	return m
}

// cluster is three (or more) schedulers, one per replica, each firing off
// later than real time.
type cluster struct {
	t      *testing.T
	scheds []gocron.Scheduler
	tally  *tally
	start  time.Time // real time at which replica 0 started
	down   []bool
	mu     sync.Mutex
}

// replicaSetup adds the scheduler options and jobs of replica i.
type replicaSetup struct {
	opts func(i int) []gocron.SchedulerOption
	jobs func(t *testing.T, s gocron.Scheduler, i int, c *tally)
}

// startCluster creates one scheduler per offset, with a clock that many
// behind, and starts replica i at start+offsets[i]. start must be a little
// in the future.
func startCluster(t *testing.T, start time.Time, offsets []time.Duration, setup replicaSetup) *cluster {
	t.Helper()
	c := &cluster{t: t, tally: newTally(start), start: start, down: make([]bool, len(offsets))}
	for i, off := range offsets {
		opts := append([]gocron.SchedulerOption{
			gocron.WithClock(skewedClock{clockwork.NewRealClock(), off}),
			gocron.WithStopTimeout(10 * time.Second),
		}, setup.opts(i)...)
		s, err := gocron.NewScheduler(opts...)
		if err != nil {
			t.Fatal(err)
		}
		setup.jobs(t, s, i, c.tally)
		c.scheds = append(c.scheds, s)
	}
	var wg sync.WaitGroup
	for i, s := range c.scheds {
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(time.Until(start.Add(offsets[i])))
			s.Start()
		}()
	}
	wg.Wait()
	t.Cleanup(c.shutdown)
	return c
}

// stop shuts replica i's scheduler down, waiting for its running jobs.
func (c *cluster) stop(i int) {
	c.mu.Lock()
	if c.down[i] {
		c.mu.Unlock()
		return
	}
	c.down[i] = true
	c.mu.Unlock()
	if err := c.scheds[i].Shutdown(); err != nil {
		c.t.Errorf("replica %d shutdown: %v", i, err)
	}
}

// shutdown stops every replica at once.
func (c *cluster) shutdown() {
	c.tally.mu.Lock()
	c.tally.stopping = true
	c.tally.mu.Unlock()
	var wg sync.WaitGroup
	for i := range c.scheds {
		wg.Add(1)
		go func() { defer wg.Done(); c.stop(i) }()
	}
	wg.Wait()
}

// countingTask returns a task for replica i that records its run under job
// (by tick, using tickOf) and then works for d, watching its lock.
func countingTask(c *tally, job string, i int, tickOf func(time.Time) int64, d time.Duration) func(ctx context.Context) {
	return func(ctx context.Context) {
		c.ran(job, tickOf(time.Now()), i)
		ctx, cancel := gocronlock.JobContext(ctx)
		defer cancel()
		select {
		case <-time.After(d):
		case <-ctx.Done():
		}
	}
}

// lockErrors returns an AfterLockError listener that records errors.
func lockErrors(c *tally) gocron.JobOption {
	return gocron.WithEventListeners(gocron.AfterLockError(func(_ uuid.UUID, name string, err error) {
		c.lockErr(name, err)
	}))
}

// waitFor polls cond until it holds or d has passed.
func waitFor(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if cond() {
			return true
		}
		time.Sleep(5 * time.Millisecond)
	}
	return cond()
}
