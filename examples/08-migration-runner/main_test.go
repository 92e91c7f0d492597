package main

import (
	"testing"

	"github.com/ubgo/lock/examples/internal/exampletest"
	"github.com/ubgo/lock/examples/internal/replica"
)

// TestScenario: three replicas boot at once and migrate to v7, a fourth
// boots after; then v8's migrator crashes mid-migration while two others
// wait. v7 must start once and v8 twice (the crashed attempt, rolled back,
// and one retry); every replica that did not crash must return with its
// schema applied, exactly one of each group having run it, and the late
// replica must not run it. A second application would fail (the DDL is
// not idempotent), so "started once" is also checked by the database. On
// filelock with an in-memory database (no infrastructure) and pglock with
// real DDL (the scenario's backend).
func TestScenario(t *testing.T) {
	exampletest.ForEach(t, []string{replica.Filelock, replica.Postgres}, func(t *testing.T, c *replica.Cluster) {
		res, err := run(exampletest.Context(t), c)
		if err != nil {
			t.Fatal(err)
		}
		if res.Started["v7"] != 1 || res.Started["v8"] != 2 {
			t.Errorf("migrations started %v, want v7 once and v8 twice", res.Started)
		}
		if len(res.Boots) != 7 {
			t.Fatalf("%d boots, want 7: %+v", len(res.Boots), res.Boots)
		}
		ran := map[string]int{}
		for i, b := range res.Boots {
			if b.Crashed {
				if b.Err == nil {
					t.Errorf("%s crashed mid-migration but its boot step returned no error", b.Replica)
				}
				continue
			}
			if b.Err != nil || !b.Ready {
				t.Errorf("%s (%s): err %v, schema ready %v", b.Replica, b.Version, b.Err, b.Ready)
			}
			if b.Ran {
				ran[b.Version]++
			}
			if i == 3 && b.Ran {
				t.Errorf("the late replica ran %s again", b.Version)
			}
		}
		if ran["v7"] != 1 || ran["v8"] != 1 {
			t.Errorf("replicas that ran each migration to completion: %v, want one each", ran)
		}
		if !res.Boots[4].Crashed {
			t.Errorf("boot 5 should be the crashed one: %+v", res.Boots)
		}
	})
}
