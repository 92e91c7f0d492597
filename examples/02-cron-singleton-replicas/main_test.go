package main

import (
	"testing"
	"time"

	"github.com/ubgo/lock/examples/internal/exampletest"
	"github.com/ubgo/lock/examples/internal/replica"
)

// TestScenario: three replicas fire for each of three hours, with jitter,
// and a late replica fires again after the work was done. Each hour must be
// aggregated exactly once, and every late replica must skip. It runs on the
// zero-infrastructure default (filelock) and on each backend the scenario
// names.
func TestScenario(t *testing.T) {
	backends := []string{replica.Filelock, replica.Postgres, replica.Redis, replica.Etcd}
	exampletest.ForEach(t, backends, func(t *testing.T, c *replica.Cluster) {
		cfg := config{Replicas: 3, Hours: 3, Jitter: 10 * time.Millisecond, Work: 30 * time.Millisecond}
		res, err := run(exampletest.Context(t), c, cfg)
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Runs) != cfg.Hours {
			t.Errorf("%d hours aggregated, want %d: %v", len(res.Runs), cfg.Hours, res.Runs)
		}
		for hour, who := range res.Runs {
			if len(who) != 1 {
				t.Errorf("%s aggregated by replicas %v, want exactly one", hour.Format(time.RFC3339), who)
			}
		}
		if res.LateSkips != cfg.Hours {
			t.Errorf("%d late replicas skipped, want %d", res.LateSkips, cfg.Hours)
		}
	})
}
