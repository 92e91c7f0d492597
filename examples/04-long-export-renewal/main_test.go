package main

import (
	"errors"
	"testing"
	"time"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/examples/internal/exampletest"
	"github.com/ubgo/lock/examples/internal/replica"
)

// TestScenario: an export 2.5 TTLs long, renewed only by KeepAlive, must
// run to its end while the other replicas skip and never run it; a second
// export whose lock an operator deletes must stop with an error matching
// lock.ErrLockLost. On filelock (no infrastructure) and redislock (the
// scenario's backend).
func TestScenario(t *testing.T) {
	exampletest.ForEach(t, []string{replica.Filelock, replica.Redis}, func(t *testing.T, c *replica.Cluster) {
		res, err := run(exampletest.Context(t), c, config{TTL: time.Second, Duration: 2500 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		if !res.Exported {
			t.Error("the healthy export did not finish")
		}
		if res.Overlaps != 0 {
			t.Errorf("another replica ran the export %d times while it was running", res.Overlaps)
		}
		if res.Skips == 0 {
			t.Error("the other replicas never tried")
		}
		if !errors.Is(res.StolenErr, lock.ErrLockLost) {
			t.Errorf("export whose lock was deleted returned %v, want ErrLockLost", res.StolenErr)
		}
		t.Logf("skips %d; export stopped %v after the lock was deleted", res.Skips, res.StoppedIn)
	})
}
