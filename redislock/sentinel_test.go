package redislock

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/internal/testenv"
)

// A Sentinel deployment: a primary, a replica and three sentinels, each a
// private redis-server on a free port; applications reach the primary
// through go-redis's failover client.

const sentinelMaster = "ubgo-lock"

// startSentinel runs a sentinel (redis-server in sentinel mode) watching
// the primary on port primary, with a quorum of two.
func startSentinel(t *testing.T, primary int) string {
	t.Helper()
	testenv.SkipShort(t, "a private redis sentinel")
	if _, err := exec.LookPath("redis-server"); err != nil {
		testenv.Unavailable(t, "redis-server binary", err)
	}
	port := freePort(t)
	conf := filepath.Join(t.TempDir(), "sentinel.conf")
	body := fmt.Sprintf("sentinel monitor %[1]s 127.0.0.1 %[2]d 2\nsentinel down-after-milliseconds %[1]s 1000\nsentinel failover-timeout %[1]s 10000\n", sentinelMaster, primary)
	if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("redis-server", conf, "--sentinel", "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--logfile", "", "--dir", t.TempDir())
	if err := cmd.Start(); err != nil {
		t.Fatalf("start a sentinel: %v", err)
	}
	t.Cleanup(func() { cmd.Process.Signal(syscall.SIGKILL); cmd.Wait() })
	return "127.0.0.1:" + strconv.Itoa(port)
}

// sentinelSetup starts the deployment and returns the sentinels' addresses
// and the primary and replica, once every sentinel knows the replica and
// the other sentinels.
func sentinelSetup(t *testing.T) (sentinels []string, primary, replica *server) {
	t.Helper()
	primary = startServer(t)
	replica = startServer(t, "--replicaof", "127.0.0.1", strconv.Itoa(primary.port))
	rep := dial(t, replica.addr())
	testenv.Eventually(t, 30*time.Second, "the replica in sync", func() bool {
		info, _ := rep.Info(context.Background(), "replication").Result()
		return strings.Contains(info, "master_link_status:up")
	})
	for range 3 {
		sentinels = append(sentinels, startSentinel(t, primary.port))
	}
	for _, addr := range sentinels {
		sc := redis.NewSentinelClient(&redis.Options{Addr: addr})
		t.Cleanup(func() { sc.Close() })
		testenv.Eventually(t, 30*time.Second, "the sentinels know each other and the replica", func() bool {
			m, err := sc.Master(context.Background(), sentinelMaster).Result()
			if err != nil || m["num-other-sentinels"] != "2" || m["num-slaves"] != "1" {
				return false
			}
			return true
		})
	}
	return sentinels, primary, replica
}

func failoverClient(t *testing.T, sentinels []string) *redis.Client {
	c := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: sentinelMaster, SentinelAddrs: sentinels})
	t.Cleanup(func() { c.Close() })
	return c
}

// primaryPort asks a sentinel which port the primary is on.
func primaryPort(t *testing.T, sentinel string) int {
	sc := redis.NewSentinelClient(&redis.Options{Addr: sentinel})
	defer sc.Close()
	addr, err := sc.GetMasterAddrByName(context.Background(), sentinelMaster).Result()
	if err != nil || len(addr) != 2 {
		return 0
	}
	p, _ := strconv.Atoi(addr[1])
	return p
}

// Failovers under a held lock whose keys reached the replica: the one
// sentinels are asked for (SENTINEL FAILOVER), then the new primary
// killed. Each time the holder either keeps its lock, renewed on the new
// primary, and nobody else gets it, or reports the loss; new acquires go
// to the new primary, with larger tokens.
func TestSentinelFailover(t *testing.T) {
	t.Parallel() // waits for private servers, beside the others that do
	sentinels, primary, replica := sentinelSetup(t)
	ctx := ctxT(t)
	const ttl = 2 * time.Second
	f := NewFactory(failoverClient(t, sentinels), WithKeyPrefix(testPrefix), WithTTL(ttl), WithLogger(nil))
	defer f.Close()
	g := NewFactory(failoverClient(t, sentinels), WithKeyPrefix(testPrefix), WithTTL(ttl), WithLogger(nil))
	defer g.Close()
	// Through the failover client a waiter in another factory is handed
	// the name at its release, as on a plain client (the conformance
	// suite runs on a plain client: the failover client is one too, to
	// whichever server the sentinels name).
	w, err := f.Acquire(ctx, uniq(t, "handoff"))
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		h, err := g.Acquire(ctx, w.Name(), WithWait())
		if err == nil {
			err = h.Release()
		}
		got <- err
	}()
	testenv.Eventually(t, 30*time.Second, "the waiter queued", func() bool {
		info, err := f.Inspect(ctx, w.Name())
		return err == nil && info.Waiting == 1
	})
	if err := w.Release(); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("the waiter: %v", err)
	}

	name := uniq(t, "failover")
	h, err := f.Acquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	last := h.Token()
	// The holder's keys are on the replica before each failover: this
	// test is about a lock that survives one; the asynchronous window is
	// the guide's.
	replicated := func(s *server) {
		t.Helper()
		rdb := dial(t, s.addr())
		testenv.Eventually(t, 30*time.Second, "the lock on the replica", func() bool {
			return rdb.Exists(context.Background(), h.k.lock).Val() == 1
		})
	}
	replicated(replica)
	sc := redis.NewSentinelClient(&redis.Options{Addr: sentinels[0]})
	defer sc.Close()
	if err := sc.Failover(ctx, sentinelMaster).Err(); err != nil {
		t.Fatalf("SENTINEL FAILOVER: %v", err)
	}
	testenv.Eventually(t, 60*time.Second, "the replica promoted", func() bool { return primaryPort(t, sentinels[0]) == replica.port })
	if n := keptOrLost(t, "after SENTINEL FAILOVER", g, []*Holder{h}, 3*ttl); n > 0 {
		t.Fatalf("two holders at once after SENTINEL FAILOVER")
	}

	if !isClosed(h.Done()) {
		replicated(primary) // the old primary is the replica now
	}
	replica.kill()
	testenv.Eventually(t, 60*time.Second, "the old primary promoted again", func() bool { return primaryPort(t, sentinels[0]) == primary.port })
	if n := keptOrLost(t, "after the new primary was killed", g, []*Holder{h}, 3*ttl); n > 0 {
		t.Fatalf("two holders at once after the new primary was killed")
	}

	h.Release()
	h2, err := g.Acquire(ctx, name, WithWait())
	if err != nil {
		t.Fatal(err)
	}
	if h2.Token() <= last {
		t.Fatalf("token %d after %d", h2.Token(), last)
	}
	h2.Release()
}

// keptOrLost watches hs for d after a failover: each either keeps its
// lock, other's Acquire of the name being refused, or reports the loss
// with ErrLockLost. It returns how many times other got a name whose
// holder had not reported a loss: two holders at once.
func keptOrLost(t *testing.T, when string, other *Factory, hs []*Holder, d time.Duration) (violations int) {
	t.Helper()
	kept := map[*Holder]bool{}
	for _, h := range hs {
		kept[h] = true
	}
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		for _, h := range hs {
			if !kept[h] {
				continue
			}
			if isClosed(h.Done()) {
				if !errors.Is(h.Err(), lock.ErrLockLost) {
					t.Fatalf("%s: %s lost with %v; want ErrLockLost", when, h.Name(), h.Err())
				}
				kept[h] = false
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			o, err := other.Acquire(ctx, h.Name())
			cancel()
			switch {
			case err == nil:
				lost := isClosed(h.Done())
				o.Release()
				if !lost {
					t.Logf("%s: a second holder of %s (token %d) beside the first (token %d), which has not reported a loss", when, h.Name(), o.Token(), h.Token())
					violations++
					kept[h] = false
				}
			case !errors.Is(err, ErrLocked):
				t.Logf("%s: Acquire(%s): %v", when, h.Name(), err)
			}
		}
		time.Sleep(d / 12)
	}
	n := 0
	for _, h := range hs {
		if kept[h] {
			n++
		}
	}
	t.Logf("%s: %d of %d locks kept, the others reported lost", when, n, len(hs))
	return violations
}
