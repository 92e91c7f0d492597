package gocronlock_test

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/go-co-op/gocron/v2"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/contrib/gocronlock"
)

// skewOffsets are how late each replica's timers fire: the last replica is
// 300ms behind the first.
var skewOffsets = []time.Duration{0, 100 * time.Millisecond, 300 * time.Millisecond}

const skewTicks = 5 // ticks every replica fires for

// TestSkew runs three real schedulers on one backend, started at skewed
// times and with skewed clocks, each with a cron job and a duration job
// that fire every second and finish at once. Every tick must run exactly
// once although the replicas fire up to 300ms apart.
func TestSkew(t *testing.T) {
	modes := []struct {
		name  string
		opts  []gocronlock.Option
		phase time.Duration // of the duration job's ticks within the second
	}{
		// The default minimum hold needs no alignment: the duration job's
		// replicas fire at .4, .5 and .7 of a second, across the rounding
		// boundary a tick key would have.
		{"defaults", nil, 400 * time.Millisecond},
		// Tick locks alone (no minimum hold on the job lock), with ticks on
		// whole seconds as the option requires.
		{"ticks", []gocronlock.Option{gocronlock.WithTickResolution(time.Second), gocronlock.WithMinHold(0)}, 0},
	}
	for _, b := range backends {
		for _, m := range modes {
			t.Run(b.name+"/"+m.name, func(t *testing.T) {
				t.Parallel()
				newLocker, _ := b.fresh(t)
				c := runSkew(t, newLocker, m.opts, m.phase)
				for _, job := range []string{"cron-short", "every-second"} {
					t.Logf("%s runs per tick (tick:count[replicas]):%s", job, c.tally.report(job))
				}
				first := c.start.Truncate(time.Second).Unix() + 1
				for job, want := range map[string][2]int64{
					"cron-short":   {first, first + skewTicks - 1},
					"every-second": {1, skewTicks},
				} {
					got := c.tally.counts(job, want[0], want[1])
					if slices.ContainsFunc(got, func(n int) bool { return n != 1 }) {
						t.Errorf("%s: runs per tick %d..%d = %v, want each 1", job, want[0], want[1], got)
					}
					if m := c.tally.maxRuns(job); m > 1 {
						t.Errorf("%s: a tick ran %d times", job, m)
					}
				}
				c.tally.mu.Lock()
				defer c.tally.mu.Unlock()
				for job, errs := range c.tally.errs {
					for _, err := range errs {
						if !errors.Is(err, lock.ErrLocked) || !errors.Is(err, gocronlock.ErrLocked) {
							t.Errorf("%s: lock error that is not contention: %v", job, err)
						}
					}
				}
			})
		}
	}

	// The same schedule without a minimum hold: the job lock is still kept
	// until each job's next tick. Timing decides how often a tick would
	// repeat without it, so this only logs.
	t.Run("memlock/no-hold-control", func(t *testing.T) {
		t.Parallel()
		newLocker, _ := backends[0].fresh(t)
		c := runSkew(t, newLocker, []gocronlock.Option{gocronlock.WithMinHold(0)}, 0)
		for _, job := range []string{"cron-short", "every-second"} {
			t.Logf("without a hold, %s runs per tick:%s (max %d)", job, c.tally.report(job), c.tally.maxRuns(job))
		}
	})
}

// runSkew runs the skew scenario and returns the stopped cluster.
func runSkew(t *testing.T, newLocker func(...lock.Option) lock.Locker, opts []gocronlock.Option, phase time.Duration) *cluster {
	start := time.Now().Truncate(time.Second).Add(time.Second + phase)
	if time.Until(start) < 300*time.Millisecond {
		start = start.Add(time.Second)
	}
	lockers := make([]*gocronlock.Locker, len(skewOffsets))
	for i := range lockers {
		// One adapter and one lock.Locker per replica, as separate
		// processes would have.
		lockers[i] = gocronlock.New(newLocker(), opts...)
	}
	c := startCluster(t, start, skewOffsets, replicaSetup{
		opts: func(i int) []gocron.SchedulerOption {
			return []gocron.SchedulerOption{gocron.WithDistributedLocker(lockers[i])}
		},
		jobs: func(t *testing.T, s gocron.Scheduler, i int, tl *tally) {
			ok := jobOK(t)
			ok(s.NewJob(gocron.CronJob("* * * * * *", true),
				gocron.NewTask(countingTask(tl, "cron-short", i, cronTick, 20*time.Millisecond)),
				gocron.WithName("cron-short"), lockErrors(tl)))
			ok(s.NewJob(gocron.DurationJob(time.Second),
				gocron.NewTask(countingTask(tl, "every-second", i, tl.durTick, 20*time.Millisecond)),
				gocron.WithName("every-second"), lockErrors(tl)))
		},
	})
	time.Sleep(time.Until(start.Add(skewTicks*time.Second + 700*time.Millisecond)))
	c.shutdown()
	for i, l := range lockers {
		if err := l.Close(); err != nil {
			t.Errorf("replica %d: Close: %v", i, err)
		}
	}
	return c
}

// jobOK returns a function that fails t if NewJob failed.
func jobOK(t *testing.T) func(gocron.Job, error) {
	return func(_ gocron.Job, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(fmt.Errorf("NewJob: %w", err))
		}
	}
}
