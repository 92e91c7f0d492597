package etcdlock_test

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/ubgo/lock/etcdlock"
	"github.com/ubgo/lock/internal/testenv"
)

// Waiters that do not fan out (issue 32.2): however many processes wait
// for a mutex, a release wakes the one behind it. On a private server,
// n contenders with a factory and client each take a name in turn; etcd's
// own count of the responses its Watch streams sent (a window's watch
// created and its deletion, the release seen by the holder's own watch)
// stays at about 3 per acquisition, where a watch of the whole prefix per
// factory costs one per waiting process.
func TestWaitersWakeOne(t *testing.T) {
	srv := startEtcd(t)
	for _, n := range []int{4, 16} {
		t.Run(strconv.Itoa(n), func(t *testing.T) {
			prefix := testPrefix(t)
			ctx := ctxT(t, time.Minute)
			fs := make([]*etcdlock.Factory, n)
			for i := range fs {
				fs[i] = factory(t, srv.dial(t), etcdlock.WithKeyPrefix(prefix), etcdlock.WithWait())
				h, err := fs[i].Acquire(ctx, "one") // lease and watch in place
				if err != nil {
					t.Fatal(err)
				}
				h.Release()
			}
			want := int64(20 * n)
			before := watchResponses(t, srv)
			var done atomic.Int64
			var wg sync.WaitGroup
			for _, f := range fs {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for done.Load() < want {
						h, err := f.Acquire(ctx, "one")
						if err != nil {
							t.Error(err)
							return
						}
						done.Add(1)
						h.Release()
					}
				}()
			}
			wg.Wait()
			per := (watchResponses(t, srv) - before) / float64(done.Load())
			t.Logf("%d contenders: %d acquisitions, %.2f watch responses each", n, done.Load(), per)
			if per > 3.5 {
				t.Errorf("%.2f watch responses per acquisition with %d contenders; want about 3, whatever their number", per, n)
			}
		})
	}
}

// watchResponses reads what srv's Watch streams sent, from its /metrics.
func watchResponses(t testing.TB, srv *etcdServer) float64 {
	t.Helper()
	resp, err := http.Get(srv.client + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var n float64
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "grpc_server_msg_sent_total{") && strings.Contains(line, `grpc_service="etcdserverpb.Watch"`) {
			f := strings.Fields(line)
			v, err := strconv.ParseFloat(f[len(f)-1], 64)
			if err != nil {
				t.Fatal(err)
			}
			n += v
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return n
}

// queuedBehind waits until n Acquires wait for name, as Inspect counts them.
func queuedBehind(t testing.TB, f *etcdlock.Factory, name string, n int) {
	t.Helper()
	testenv.Eventually(t, 30*time.Second, fmt.Sprintf("%d waiting for %q", n, name), func() bool {
		info, err := f.Inspect(context.Background(), name)
		if err != nil {
			t.Fatal(err)
		}
		return info.Waiting == n
	})
}

// acquireAsync runs Acquire with WithWait in a goroutine; its result comes
// on the channel.
func acquireAsync(ctx context.Context, f *etcdlock.Factory, name string) <-chan *etcdlock.Holder {
	ch := make(chan *etcdlock.Holder, 1)
	go func() {
		h, err := f.Acquire(ctx, name, etcdlock.WithWait())
		if err != nil {
			h = nil
		}
		ch <- h
	}()
	return ch
}

// The waiter just ahead gives up: the one behind it, which watched that
// waiter's key, looks again, watches the holder instead, and is served
// when the holder releases, not before.
func TestWaiterAheadGivesUp(t *testing.T) {
	cli := client(t)
	prefix := testPrefix(t)
	f := factory(t, cli, etcdlock.WithKeyPrefix(prefix))
	g := factory(t, cli, etcdlock.WithKeyPrefix(prefix))
	k := factory(t, cli, etcdlock.WithKeyPrefix(prefix))
	ctx := ctxT(t, time.Minute)
	h, err := f.Acquire(ctx, "q")
	if err != nil {
		t.Fatal(err)
	}
	gctx, giveUp := context.WithCancel(ctx)
	first := acquireAsync(gctx, g, "q")
	queuedBehind(t, f, "q", 1)
	second := acquireAsync(ctx, k, "q")
	queuedBehind(t, f, "q", 2)
	giveUp()
	if w := <-first; w != nil {
		t.Fatal("the waiter that gave up acquired")
	}
	queuedBehind(t, f, "q", 1)
	select {
	case <-second:
		t.Fatal("the second waiter acquired while the holder held, once the waiter ahead gave up")
	case <-time.After(300 * time.Millisecond):
	}
	if err := h.Release(); err != nil {
		t.Fatal(err)
	}
	w := <-second
	if w == nil {
		t.Fatal("the second waiter was not served")
	}
	if w.Token() <= h.Token() {
		t.Fatalf("token %d after %d", w.Token(), h.Token())
	}
	w.Release()
}

// A waiter whose lease is revoked while it waits queues again on a new
// lease and is served; the revoked lease is never used again.
func TestWaiterLeaseRevoked(t *testing.T) {
	cli := client(t)
	prefix := testPrefix(t)
	f := factory(t, cli, etcdlock.WithKeyPrefix(prefix))
	g := factory(t, cli, etcdlock.WithKeyPrefix(prefix))
	ctx := ctxT(t, time.Minute)
	h, err := f.Acquire(ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	other, err := g.Acquire(ctx, "other") // on the lease the waiter gets
	if err != nil {
		t.Fatal(err)
	}
	got := acquireAsync(ctx, g, "r")
	queuedBehind(t, f, "r", 1)
	if _, err := cli.Revoke(ctx, other.Lease()); err != nil {
		t.Fatal(err)
	}
	waitClosed(t, other.Done(), 10*time.Second, "loss of the lock on the revoked lease")
	testenv.Eventually(t, 30*time.Second, "the waiter queued again on a new lease", func() bool {
		resp, err := cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
		if err != nil {
			t.Fatal(err)
		}
		for _, kv := range resp.Kvs {
			if string(kv.Key) != h.Key() && kv.Lease != int64(other.Lease()) {
				return true
			}
		}
		return false
	})
	if err := h.Release(); err != nil {
		t.Fatal(err)
	}
	w := <-got
	if w == nil {
		t.Fatal("the waiter was not served")
	}
	if w.Lease() == other.Lease() || w.Token() <= h.Token() {
		t.Fatalf("lease %x (revoked %x), token %d after %d", w.Lease(), other.Lease(), w.Token(), h.Token())
	}
	w.Release()
}

// While a waiter is cut off, the holder releases and etcd compacts past
// the release: the waiter's watch cannot resume, so it is set up again
// and the waiter looks at the queue, which it now heads.
func TestFaultWaiterWatchCompacted(t *testing.T) {
	srv := startEtcd(t)
	admin := srv.dial(t)
	p := startProxy(t, srv.endpoints()[0])
	ctx := ctxT(t, time.Minute)
	f := factory(t, admin, etcdlock.WithTTL(20*time.Second))
	g := factory(t, p.dial(t), etcdlock.WithTTL(20*time.Second))
	h, err := f.Acquire(ctx, "compacted")
	if err != nil {
		t.Fatal(err)
	}
	got := acquireAsync(ctx, g, "compacted")
	queuedBehind(t, f, "compacted", 1)
	p.setCut(true)
	if err := h.Release(); err != nil {
		t.Fatal(err)
	}
	resp, err := admin.Put(ctx, "filler", "x")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Compact(ctx, resp.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
	p.setCut(false)
	select {
	case w := <-got:
		if w == nil {
			t.Fatal("the waiter failed")
		}
		if w.Token() <= h.Token() {
			t.Fatalf("token %d after %d", w.Token(), h.Token())
		}
		w.Release()
	case <-time.After(30 * time.Second):
		t.Fatal("the waiter was not served within 30s of the reconnection")
	}
}
