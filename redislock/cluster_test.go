package redislock

import (
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// startCluster runs a one-node Redis Cluster that owns every slot: enough to
// check that all of a name's keys share a slot (scripts would fail with
// CROSSSLOT otherwise) and that a *redis.ClusterClient works throughout.
func startCluster(t *testing.T) (*redis.ClusterClient, string) {
	t.Helper()
	conf := filepath.Join(t.TempDir(), "nodes.conf")
	srv := startServer(t, "--cluster-enabled", "yes", "--cluster-config-file", conf)
	admin := dial(t, srv.addr())
	ctx := ctxT(t)
	if err := admin.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", 0, 16383).Err(); err != nil {
		t.Fatalf("CLUSTER ADDSLOTSRANGE: %v", err)
	}
	waitFor(t, 30*time.Second, "cluster state ok", func() bool {
		info, _ := admin.ClusterInfo(ctx).Result()
		return strings.Contains(info, "cluster_state:ok")
	})
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{srv.addr()}})
	t.Cleanup(func() { cc.Close() })
	if err := cc.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	return cc, srv.addr()
}

func TestClusterConformance(t *testing.T) {
	cc, _ := startCluster(t)
	runConformance(t, cc, cc)
}

// Renewal of mutexes and semaphore permits one script each (the path for
// clusters and rings) keeps them over several TTLs.
func TestClusterRenewal(t *testing.T) {
	cc, addr := startCluster(t)
	t.Run("ClusterClient", func(t *testing.T) { testRenewal(t, cc) })
	// A plain client on a cluster node: batched renewal across slots is
	// refused (CROSSSLOT), and the factory falls back to one script per lock.
	t.Run("plain client", func(t *testing.T) {
		if f := testRenewal(t, dial(t, addr)); f.together.Load() {
			t.Error("the factory still batches renewals across slots")
		}
	})
}

func testRenewal(t *testing.T, c Client) *Factory {
	f := NewFactory(c, WithKeyPrefix(testPrefix), WithTTL(500*time.Millisecond), WithLogger(nil))
	defer f.Close()
	ctx := ctxT(t)
	var hs []*Holder
	for i, limit := range []int{1, 1, 2, 3} {
		h, err := f.Acquire(ctx, uniq(t, strconv.Itoa(i)), WithMaxConcurrent(limit), WithAutoRenew(true))
		if err != nil {
			t.Fatal(err)
		}
		hs = append(hs, h)
	}
	time.Sleep(2 * time.Second)
	for _, h := range hs {
		if h.Err() != nil {
			t.Fatalf("%s lost while renewed: %v", h.Name(), h.Err())
		}
		if err := h.Release(); err != nil {
			t.Fatal(err)
		}
	}
	// Once its permits are released, a name takes any limit.
	h, err := f.Acquire(ctx, hs[2].Name(), WithMaxConcurrent(5))
	if err != nil {
		t.Fatal(err)
	}
	h.Release()
	return f
}
