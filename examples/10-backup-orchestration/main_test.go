package main

import (
	"testing"
	"time"

	"github.com/ubgo/lock/examples/internal/exampletest"
	"github.com/ubgo/lock/examples/internal/replica"
)

// TestScenario: ten hosts, two days; eight fire around midnight with
// jitter, two after the backup finished. Each day must be backed up exactly
// once, and every late host must skip. On filelock with an in-memory
// ledger (no infrastructure), etcd (the scenario's backend; ledger in etcd)
// and Redis (its AP alternative; ledger in Redis).
func TestScenario(t *testing.T) {
	backends := []string{replica.Filelock, replica.Etcd, replica.Redis}
	exampletest.ForEach(t, backends, func(t *testing.T, c *replica.Cluster) {
		cfg := config{Hosts: 10, Days: 2, Jitter: 10 * time.Millisecond, Late: 2, Work: 30 * time.Millisecond}
		res, err := run(exampletest.Context(t), c, cfg)
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Backups) != cfg.Days {
			t.Errorf("backups on %d days, want %d: %v", len(res.Backups), cfg.Days, res.Backups)
		}
		for day, hosts := range res.Backups {
			if len(hosts) != 1 {
				t.Errorf("%s backed up by %v, want exactly one host", day, hosts)
			}
		}
		if res.LateSkips != cfg.Days*cfg.Late {
			t.Errorf("%d late hosts skipped, want %d", res.LateSkips, cfg.Days*cfg.Late)
		}
	})
}
