package redislock

import (
	"errors"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ubgo/lock"
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

// startCluster3 runs a Redis Cluster of three masters, without replicas, on
// free ports, the slots split evenly. The masters keep
// serving their slots while another is down.
func startCluster3(t *testing.T) []*server {
	t.Helper()
	dir := t.TempDir()
	var nodes []*server
	var admins []*redis.Client
	var buses []int
	for range 3 {
		// Free ports for clients and for the cluster bus (by default the
		// client port + 10000, which may be taken or out of range), so
		// that two runs of the tests at once do not collide.
		port, bus := freePort(t), freePort(t)
		buses = append(buses, bus)
		conf := filepath.Join(dir, "nodes-"+strconv.Itoa(port)+".conf")
		srv := startServerOn(t, port, "--cluster-enabled", "yes", "--cluster-config-file", conf,
			"--cluster-port", strconv.Itoa(bus),
			"--cluster-require-full-coverage", "no", "--cluster-node-timeout", "5000")
		nodes = append(nodes, srv)
		admins = append(admins, dial(t, srv.addr()))
	}
	ctx := ctxT(t)
	for i, a := range admins {
		lo, hi := i*16384/3, (i+1)*16384/3-1
		if err := a.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", lo, hi).Err(); err != nil {
			t.Fatalf("CLUSTER ADDSLOTSRANGE %d %d: %v", lo, hi, err)
		}
		if i > 0 {
			if err := admins[0].Do(ctx, "CLUSTER", "MEET", "127.0.0.1", nodes[i].port, buses[i]).Err(); err != nil {
				t.Fatalf("CLUSTER MEET: %v", err)
			}
		}
	}
	waitFor(t, 30*time.Second, "three-master cluster ok", func() bool {
		for _, a := range admins {
			info, _ := a.ClusterInfo(ctx).Result()
			if !strings.Contains(info, "cluster_state:ok") || !strings.Contains(info, "cluster_known_nodes:3") ||
				!strings.Contains(info, "cluster_slots_assigned:16384") {
				return false
			}
		}
		return true
	})
	return nodes
}

// Renewal on a cluster goes to each master on its own: with one of three
// masters killed, the locks on the two live ones stay held through several
// TTLs, while those on the dead one are lost at their deadline.
func TestClusterDeadMasterLosesOnlyItsLocks(t *testing.T) {
	nodes := startCluster3(t)
	var addrs []string
	for _, n := range nodes {
		addrs = append(addrs, n.addr())
	}
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	defer cc.Close()
	ctx := ctxT(t)
	const ttl = 3 * time.Second
	f := NewFactory(cc, WithKeyPrefix(testPrefix), WithTTL(ttl), WithLogger(nil))
	defer f.Close()
	byNode := map[string][]*Holder{}
	for i := range 90 {
		h, err := f.Acquire(ctx, uniq(t, strconv.Itoa(i)), WithAutoRenew(true), WithMaxConcurrent(1+i%2))
		if err != nil {
			t.Fatal(err)
		}
		node, err := cc.MasterForKey(ctx, h.k.lock)
		if err != nil {
			t.Fatal(err)
		}
		byNode[node.Options().Addr] = append(byNode[node.Options().Addr], h)
	}
	dead := nodes[2]
	var live []*Holder
	for _, n := range nodes[:2] {
		live = append(live, byNode[n.addr()]...)
	}
	if len(byNode) != 3 {
		t.Fatalf("locks on %d masters; want all 3", len(byNode))
	}
	lost := make(chan *Holder, len(live))
	for _, h := range live {
		go func() {
			<-h.Done()
			lost <- h
		}()
	}
	dead.kill()
	killed := time.Now()
	for _, h := range byNode[dead.addr()] {
		select {
		case <-h.Done():
		case <-time.After(10 * ttl):
			t.Fatalf("%s, on the killed master, still held", h.Name())
		}
	}
	t.Logf("the %d locks on the killed master were lost within %v", len(byNode[dead.addr()]), time.Since(killed).Round(time.Millisecond))
	select {
	case h := <-lost:
		t.Fatalf("%s, on a live master, lost %v after the other master was killed: %v (%d locks on the live masters)",
			h.Name(), time.Since(killed).Round(time.Millisecond), h.Err(), len(live))
	case <-time.After(3 * ttl):
	}
	for _, h := range live {
		if err := h.Release(); err != nil {
			t.Fatalf("release of %s: %v", h.Name(), err)
		}
	}
}

// Names and key prefixes with the characters of a hash tag: every key of
// a name stays in one slot (no CROSSSLOT), and two names never share keys.
func TestClusterHashTagNames(t *testing.T) {
	nodes := startCluster3(t)
	var addrs []string
	for _, n := range nodes {
		addrs = append(addrs, n.addr())
	}
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	defer cc.Close()
	ctx := ctxT(t)
	names := []string{"{", "}", "{}", "}{", "a{b}c", "a{b}d", "{a}", "a", "{{a}}"}
	if err := NewFactory(cc, WithKeyPrefix(testPrefix+"{}")).Err(); !errors.Is(err, lock.ErrInvalidOption) {
		t.Errorf("a prefix with an empty hash tag: Err() = %v; want ErrInvalidOption", err)
	}
	for _, prefix := range []string{testPrefix, testPrefix + "{x}", testPrefix + "}{", testPrefix + "{", testPrefix + "}"} {
		f := NewFactory(cc, WithKeyPrefix(prefix), WithLogger(nil))
		for _, limit := range []int{1, 2} {
			var hs []*Holder
			for _, name := range names {
				h, err := f.Acquire(ctx, name, WithMaxConcurrent(limit))
				if err != nil {
					t.Fatalf("prefix %q, limit %d: Acquire(%q): %v (two names sharing keys, or keys of one name in two slots)", prefix, limit, name, err)
				}
				hs = append(hs, h)
			}
			for _, h := range hs {
				if err := h.Extend(ctx); err != nil {
					t.Fatalf("prefix %q: Extend(%q): %v", prefix, h.Name(), err)
				}
				info, err := f.Inspect(ctx, h.Name())
				if err != nil || len(info.Holders) != 1 || info.Holders[0].Token != h.Token() {
					t.Fatalf("prefix %q: Inspect(%q) = %+v, %v; want its one holder", prefix, h.Name(), info, err)
				}
				if err := h.Release(); err != nil {
					t.Fatalf("prefix %q: Release(%q): %v", prefix, h.Name(), err)
				}
			}
		}
		f.Close()
	}
}
