package main

import (
	"errors"
	"testing"
	"time"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/contrib/gocronlock"
	"github.com/ubgo/lock/examples/internal/exampletest"
	"github.com/ubgo/lock/examples/internal/replica"
)

// TestScenario runs three real gocron schedulers with default gocronlock
// options, started a third of the interval apart as a rolling deploy does
// (0, 267 and 533ms, a job every 800ms), until every replica fired four
// ticks. Each tick must have run exactly once, all on the replica that
// ran the first (it keeps the job while it lives), and every skip must be
// contention (ErrLocked), not a backend failure. On filelock (no
// infrastructure) and redislock (the backend the scenario's code uses).
func TestScenario(t *testing.T) {
	exampletest.ForEach(t, []string{replica.Filelock, replica.Redis}, func(t *testing.T, c *replica.Cluster) {
		cfg := config{
			Skews:    []time.Duration{0, 267 * time.Millisecond, 533 * time.Millisecond},
			Interval: 800 * time.Millisecond, Ticks: 4, Work: 20 * time.Millisecond,
		}
		res, err := run(exampletest.Context(t), c, cfg)
		if err != nil {
			t.Fatal(err)
		}
		for tick := 1; tick <= cfg.Ticks; tick++ {
			if n := len(res.Runs[tick]); n != 1 {
				t.Errorf("tick %d ran on replicas %v, want exactly one", tick, res.Runs[tick])
			}
		}
		owners := map[int]bool{}
		for tick, who := range res.Runs {
			if len(who) > 1 {
				t.Errorf("tick %d ran on replicas %v", tick, who)
			}
			for _, r := range who {
				owners[r] = true
			}
		}
		if len(owners) > 1 {
			t.Errorf("the job moved between live replicas: runs %v", res.Runs)
		}
		for _, err := range res.LockErrs {
			if !errors.Is(err, lock.ErrLocked) || !errors.Is(err, gocronlock.ErrLocked) {
				t.Errorf("a skip that is not contention: %v", err)
			}
		}
		t.Logf("runs %v, fires %v", res.Runs, res.Fires)
	})
}
