package main

import (
	"net/http"
	"testing"
	"time"

	"github.com/ubgo/lock/examples/internal/exampletest"
	"github.com/ubgo/lock/examples/internal/replica"
)

// TestScenario delivers evt_1 twice 10ms apart to two replicas and once
// more after it was processed, evt_2 once, and evt_3 whose first
// processing fails and then its retry, all over HTTP. Every event must be
// processed exactly once; every delivery answered 200 except evt_3's first
// (500, so that the processor retries). On filelock (no infrastructure) and
// pglock (the scenario's multi-host backend).
func TestScenario(t *testing.T) {
	exampletest.ForEach(t, []string{replica.Filelock, replica.Postgres}, func(t *testing.T, c *replica.Cluster) {
		res, err := run(exampletest.Context(t), c, config{Replicas: 2, Work: 30 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range []string{"evt_1", "evt_2", "evt_3"} {
			if n := res.Processed[ev]; n != 1 {
				t.Errorf("%s processed %d times, want 1", ev, n)
			}
		}
		failed := 0
		for _, d := range res.Deliveries {
			switch {
			case d.Event == "evt_3" && d.Status == http.StatusInternalServerError:
				failed++
			case d.Status != http.StatusOK:
				t.Errorf("%s to replica-%d: status %d", d.Event, d.Replica, d.Status)
			}
		}
		if failed != 1 {
			t.Errorf("evt_3's failed processing answered 500 %d times, want 1", failed)
		}
		if len(res.Deliveries) != 6 {
			t.Errorf("%d deliveries answered, want 6", len(res.Deliveries))
		}
	})
}
