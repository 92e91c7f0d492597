package main

import (
	"errors"
	"testing"
	"time"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/examples/internal/exampletest"
	"github.com/ubgo/lock/examples/internal/replica"
)

// TestScenario: three replicas campaign with lock.Lead; the leader dies
// (its process stops and its connection or files go away without a
// release). Another replica must take over with a larger epoch, never two
// live leaders at once, the dead leader's late write must be refused with
// ErrStaleToken, and CurrentLeader must name the new leader. On flock (no
// infrastructure) and etcd (the scenario's backend, TTL 2s).
func TestScenario(t *testing.T) {
	exampletest.ForEach(t, []string{replica.Flock, replica.Etcd}, func(t *testing.T, c *replica.Cluster) {
		cfg := config{Replicas: 3, TTL: 2 * time.Second, Retry: 50 * time.Millisecond, Every: 10 * time.Millisecond}
		res, err := run(exampletest.Context(t), c, cfg)
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Terms) < 2 {
			t.Fatalf("terms %v: the leadership did not move", res.Terms)
		}
		old, nu := res.Terms[0], res.Terms[1]
		if nu.Replica == old.Replica || nu.Epoch <= old.Epoch {
			t.Errorf("after %v died, %v led", old, nu)
		}
		for i := 1; i < len(res.Terms); i++ {
			if res.Terms[i].Epoch <= res.Terms[i-1].Epoch {
				t.Errorf("epochs not increasing: %v", res.Terms)
			}
		}
		if res.MaxLeaders != 1 {
			t.Errorf("%d live leaders worked at once", res.MaxLeaders)
		}
		if res.RejectedLive != 0 {
			t.Errorf("the fence refused %d writes of live leaders", res.RejectedLive)
		}
		if !errors.Is(res.StaleErr, lock.ErrStaleToken) {
			t.Errorf("dead leader's late write: %v, want ErrStaleToken", res.StaleErr)
		}
		if res.Current != res.Terms[len(res.Terms)-1].Replica {
			t.Errorf("CurrentLeader says %q, terms %v", res.Current, res.Terms)
		}
		t.Logf("terms %v; takeover %v", res.Terms, res.Takeover)
	})
}
