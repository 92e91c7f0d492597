package main

import (
	"testing"
	"time"

	"github.com/ubgo/lock/examples/internal/exampletest"
	"github.com/ubgo/lock/examples/internal/replica"
)

// TestScenario: alice clicks five times while her rebuild runs (on two
// replicas), bob once meanwhile, alice once more afterwards. Alice must get
// two rebuilds (one during the burst, one after) and four "in progress"
// answers, never two of her rebuilds at once; bob's rebuild must run while
// alice's is held open (the user locks are independent). On filelock (no
// infrastructure) and redislock (the scenario's backend).
func TestScenario(t *testing.T) {
	exampletest.ForEach(t, []string{replica.Filelock, replica.Redis}, func(t *testing.T, c *replica.Cluster) {
		res, err := run(exampletest.Context(t), c, 10*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		if res.Rebuilds["alice"] != 2 || res.InProgress["alice"] != 4 {
			t.Errorf("alice: %d rebuilds, %d 'in progress'; want 2 and 4", res.Rebuilds["alice"], res.InProgress["alice"])
		}
		if res.Rebuilds["bob"] != 1 || res.InProgress["bob"] != 0 {
			t.Errorf("bob: %d rebuilds, %d 'in progress'; want 1 and 0", res.Rebuilds["bob"], res.InProgress["bob"])
		}
		for user, n := range res.MaxConcurrent {
			if n != 1 {
				t.Errorf("%s: %d rebuilds at once", user, n)
			}
		}
		if !res.Overlapped {
			t.Error("bob's rebuild did not run while alice's was running")
		}
	})
}
