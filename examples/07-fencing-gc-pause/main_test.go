package main

import (
	"errors"
	"testing"
	"time"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/examples/internal/exampletest"
	"github.com/ubgo/lock/examples/internal/replica"
)

// TestScenario: A acquires, builds, and pauses past its lease; B takes the
// lock and uploads; A resumes and uploads. B's upload must be accepted,
// A's refused with ErrStaleToken (not a lock error), and the store must
// keep B's export. On filelock with a file store (no infrastructure),
// redislock with Fence.Apply (the scenario's backend) and
// etcdlock with its Fence.Apply.
func TestScenario(t *testing.T) {
	exampletest.ForEach(t, []string{replica.Filelock, replica.Redis, replica.Etcd}, func(t *testing.T, c *replica.Cluster) {
		res, err := run(exampletest.Context(t), c, config{TTL: 300 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		if !errors.Is(res.AErr, lock.ErrStaleToken) || errors.Is(res.AErr, lock.ErrLocked) || errors.Is(res.AErr, lock.ErrLockLost) {
			t.Errorf("A's stale upload: %v, want ErrStaleToken alone", res.AErr)
		}
		if res.Stored != "export by B" {
			t.Errorf("the store keeps %q, want B's export", res.Stored)
		}
	})
}

// TestStores checks each store against the Fence rules on its own: equal
// tokens accepted, lower ones and 0 refused (and the data left alone),
// tokens above 2^53 compared exactly, and a record made by one client seen
// by another.
func TestStores(t *testing.T) {
	exampletest.ForEach(t, []string{replica.Filelock, replica.Redis, replica.Etcd}, func(t *testing.T, c *replica.Cluster) {
		ctx := exampletest.Context(t)
		var stores []FencedStore
		for range 2 {
			r, err := c.Replica(ctx)
			if err != nil {
				t.Fatal(err)
			}
			stores = append(stores, newStore(c, r))
		}
		const big = 1<<53 + 1
		for i, step := range []struct {
			token uint64
			ok    bool
		}{{0, false}, {5, true}, {5, true}, {4, false}, {big, true}, {big - 1, false}, {big, true}, {1 << 63, true}, {big, false}} {
			data := []byte{byte('a' + i)}
			err := stores[i%2].Put(ctx, "k", data, step.token)
			if step.ok != (err == nil) || (!step.ok && !errors.Is(err, lock.ErrStaleToken)) {
				t.Errorf("step %d: token %d: %v, want ok=%v", i, step.token, err, step.ok)
			}
			if got, err := stores[(i+1)%2].Get(ctx, "k"); err == nil && step.ok && string(got) != string(data) {
				t.Errorf("step %d: stored %q, want %q", i, got, data)
			}
		}
		got, err := stores[0].Get(ctx, "k")
		if err != nil || string(got) != "h" {
			t.Errorf("final data %q, %v; want the last accepted write %q", got, err, "h")
		}
	})
}
