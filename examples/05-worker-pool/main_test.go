package main

import (
	"errors"
	"testing"
	"time"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/examples/internal/exampletest"
	"github.com/ubgo/lock/examples/internal/replica"
)

// TestScenario indexes 50 batches from two processes with a limit of 3:
// every batch must be indexed, never more than 3 at once, and a process
// that asks for 4 permits meanwhile must get ErrLimitMismatch. filelock is
// the scenario's backend (no infrastructure); the semaphore works the same
// on every other backend, so they run too.
func TestScenario(t *testing.T) {
	backends := []string{replica.Filelock, replica.Flock, replica.Postgres, replica.Redis, replica.Etcd}
	exampletest.ForEach(t, backends, func(t *testing.T, c *replica.Cluster) {
		cfg := config{Batches: 50, Processes: 2, Limit: 3, Work: 10 * time.Millisecond}
		res, err := run(exampletest.Context(t), c, cfg)
		if err != nil {
			t.Fatal(err)
		}
		if res.Indexed != cfg.Batches {
			t.Errorf("indexed %d batches, want %d", res.Indexed, cfg.Batches)
		}
		if res.Peak > cfg.Limit || res.Peak < 1 {
			t.Errorf("at most %d batches indexed at once, want 1..%d", res.Peak, cfg.Limit)
		}
		if !errors.Is(res.Mismatch, lock.ErrLimitMismatch) {
			t.Errorf("a process asking for %d permits got %v, want ErrLimitMismatch", cfg.Limit+1, res.Mismatch)
		}
		t.Logf("peak %d", res.Peak)
	})
}
