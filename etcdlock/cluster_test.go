package etcdlock_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/etcdlock"
)

// The tests here run on a private cluster of three members, the smallest
// that survives losing one.

// clusterEndpoints are the client addresses of all of ms.
func clusterEndpoints(ms []*etcdServer) []string {
	var eps []string
	for _, m := range ms {
		eps = append(eps, m.endpoints()...)
	}
	return eps
}

// dialCluster connects to every member of ms, like an application
// configured with the whole cluster.
func dialCluster(t testing.TB, ms []*etcdServer) *clientv3.Client {
	t.Helper()
	cli, err := dial(t, clusterEndpoints(ms))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// leader returns the member that leads the cluster now.
func leader(t testing.TB, cli *clientv3.Client, ms []*etcdServer) *etcdServer {
	t.Helper()
	for _, m := range ms {
		if m.cmd == nil {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		st, err := cli.Status(ctx, m.endpoints()[0])
		cancel()
		if err == nil && st.Leader == st.Header.MemberId {
			return m
		}
	}
	t.Fatal("no member leads the cluster")
	return nil
}

func TestClusterConformance(t *testing.T) {
	ms := startEtcdCluster(t, 3)
	conformance(t, dialCluster(t, ms), dialCluster(t, ms), time.Second)
}

// The leader is killed while clients, each with a client and factory of its
// own as separate processes would have, contend for one name with
// WithWait: no grant is ever made while another holder still holds (its
// loss unreported and its key still on the server), tokens keep
// increasing, and every contender gets the lock again after the kill.
func TestClusterLeaderKilled(t *testing.T) {
	t.Parallel() // waits for private servers, beside the others that do
	ms := startEtcdCluster(t, 3)
	const contenders = 4
	prefix := testPrefix(t)
	ctx := ctxT(t, 2*time.Minute)

	var (
		mu        sync.Mutex
		inside    = map[int]*etcdlock.Holder{}
		last      uint64
		killed    bool
		after     [contenders]int // acquisitions after the kill
		total     int
		violation []string
		progress  = make(chan struct{}, 1)
	)
	check := func(cli *clientv3.Client, id int, h *etcdlock.Holder) {
		mu.Lock()
		defer mu.Unlock()
		for other, o := range inside {
			select {
			case <-o.Done():
				continue
			default:
			}
			kctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			resp, err := cli.Get(kctx, o.Key(), clientv3.WithCountOnly())
			cancel()
			if err == nil && resp.Count > 0 {
				violation = append(violation, fmt.Sprintf("contender %d granted (token %d) while %d holds (token %d, key %s on the server)", id, h.Token(), other, o.Token(), o.Key()))
			}
		}
		if h.Token() <= last {
			violation = append(violation, fmt.Sprintf("contender %d's token %d after %d", id, h.Token(), last))
		}
		last = h.Token()
		inside[id] = h
		total++
		if killed {
			after[id]++
		}
		select {
		case progress <- struct{}{}:
		default:
		}
	}
	leave := func(id int) {
		mu.Lock()
		delete(inside, id)
		mu.Unlock()
	}

	stop := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, contenders)
	for i := 0; i < contenders; i++ {
		cli := dialCluster(t, ms)
		f := factory(t, cli, etcdlock.WithKeyPrefix(prefix), etcdlock.WithTTL(2*time.Second))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				actx, cancel := context.WithTimeout(ctx, 20*time.Second)
				h, err := f.Acquire(actx, "leader", etcdlock.WithWait())
				cancel()
				if err != nil {
					if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, lock.ErrLocked) {
						errs <- fmt.Errorf("contender %d: %w", i, err)
						return
					}
					continue // the cluster is electing: try again
				}
				check(cli, i, h)
				time.Sleep(time.Millisecond) // the work under the lock
				leave(i)
				h.Release()
			}
		}()
	}
	waitFor := func(what string, done func() bool) {
		t.Helper()
		for {
			mu.Lock()
			ok := done()
			mu.Unlock()
			if ok {
				return
			}
			select {
			case <-progress:
			case err := <-errs:
				t.Fatalf("%s: %v", what, err)
			case <-ctx.Done():
				t.Fatalf("%s: not by the deadline", what)
			}
		}
	}
	waitFor("20 acquisitions before the kill", func() bool { return total >= 20 })
	l := leader(t, dialCluster(t, ms), ms)
	mu.Lock()
	killed = true
	mu.Unlock()
	l.kill()
	t.Logf("killed the leader %s", l.name)
	waitFor("every contender acquiring twice after the kill", func() bool {
		for _, n := range after {
			if n < 2 {
				return false
			}
		}
		return true
	})
	close(stop)
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	t.Logf("%d acquisitions, %v after the kill", total, after)
	for _, v := range violation {
		t.Error(v)
	}
}

// Two of three members killed: no quorum. An Acquire fails with an error
// that is not ErrLocked, the holder reports its loss (it can no longer
// renew), and once the members are back the tokens of new holders are
// larger than any before.
func TestClusterQuorumLost(t *testing.T) {
	t.Parallel() // waits for private servers, beside the others that do
	ms := startEtcdCluster(t, 3)
	cli := dialCluster(t, ms)
	prefix := testPrefix(t)
	ctx := ctxT(t, 2*time.Minute)
	f := factory(t, cli, etcdlock.WithKeyPrefix(prefix), etcdlock.WithTTL(time.Second))
	h, err := f.Acquire(ctx, "quorum")
	if err != nil {
		t.Fatal(err)
	}
	l := leader(t, cli, ms)
	down := []*etcdServer{l} // the leader and one more
	for _, m := range ms {
		if m != l {
			down = append(down, m)
			break
		}
	}
	killed := time.Now()
	for _, m := range down {
		m.kill()
	}
	waitClosed(t, h.Done(), 30*time.Second, "the holder's loss without a quorum")
	t.Logf("loss reported %v after the quorum was lost (TTL 1s)", time.Since(killed).Round(time.Millisecond))
	if !errors.Is(h.Err(), lock.ErrLockLost) {
		t.Fatalf("Err = %v; want ErrLockLost", h.Err())
	}
	for _, name := range []string{"quorum", "free"} {
		actx, cancel := context.WithTimeout(ctx, 3*time.Second)
		g, err := f.Acquire(actx, name)
		cancel()
		switch {
		case err == nil:
			g.Release()
			t.Fatalf("Acquire(%q) without a quorum succeeded", name)
		case errors.Is(err, lock.ErrLocked):
			t.Fatalf("Acquire(%q) without a quorum = %v; an outage must not read as contention", name, err)
		}
		t.Logf("Acquire(%q) without a quorum: %v", name, err)
	}
	for _, m := range down {
		m.launch()
	}
	for _, m := range down {
		m.ready()
	}
	g := factory(t, dialCluster(t, ms), etcdlock.WithKeyPrefix(prefix), etcdlock.WithTTL(time.Second))
	h2, err := g.Acquire(ctx, "quorum", etcdlock.WithWait())
	if err != nil {
		t.Fatal(err)
	}
	defer h2.Release()
	if h2.Token() <= h.Token() {
		t.Fatalf("token %d after the quorum came back, %d before", h2.Token(), h.Token())
	}
	if err := h.Release(); !errors.Is(err, lock.ErrLockLost) {
		t.Fatalf("the lost holder's Release = %v; want ErrLockLost", err)
	}
	if info, err := g.Inspect(ctx, "quorum"); err != nil || len(info.Holders) != 1 || info.Holders[0].Token != h2.Token() {
		t.Fatalf("Inspect = %+v, %v; want the new holder alone", info, err)
	}
}
