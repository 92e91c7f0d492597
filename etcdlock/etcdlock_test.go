package etcdlock_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/backend"
	"github.com/ubgo/lock/etcdlock"
	"github.com/ubgo/lock/internal/testenv"
	"github.com/ubgo/lock/locktest"
)

func TestConformance(t *testing.T) {
	// The shared server runs with etcd's default election timeout, whose
	// minimum lease is 2s.
	conformance(t, client(t), client(t), 2*time.Second)
}

// conformance runs the locktest suite on the etcd that cli and operator
// reach, with leases of ttl.
func conformance(t *testing.T, cli, operator *clientv3.Client, ttl time.Duration) {
	prefix := testPrefix(t)
	inspector := factory(t, cli, etcdlock.WithKeyPrefix(prefix))
	locktest.Run(t, locktest.Backend{
		New: func(t testing.TB, opts ...lock.Option) lock.Locker {
			return factory(t, cli, etcdlock.WithKeyPrefix(prefix)).AsLocker(opts...)
		},
		ErrLocked:   etcdlock.ErrLocked,
		ErrLockLost: etcdlock.ErrLockLost,
		Wait:        true,
		Semaphore:   true,
		Shared:      true,
		Extend:      true,
		TTL:         ttl,
		Inspector:   func(t testing.TB) lock.Inspector { return factory(t, cli, etcdlock.WithKeyPrefix(prefix)) },
		Lister:      func(t testing.TB) lock.Lister { return factory(t, cli, etcdlock.WithKeyPrefix(prefix)) },
		// The keys hold no name: a hashed one is listed escaped.
		ListEscapesLongNames: true,
		Dial: func(t testing.TB, addr string, opts ...lock.Option) lock.Locker {
			cli, err := clientv3.New(clientv3.Config{Endpoints: []string{addr}, Logger: zap.NewNop()})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { cli.Close() })
			return factory(t, cli, etcdlock.WithKeyPrefix(prefix)).AsLocker(opts...)
		},
		Lose: func(t testing.TB, h lock.Holder) {
			// An operator deletes the key.
			if _, err := operator.Delete(context.Background(), h.(*etcdlock.Holder).Key()); err != nil {
				t.Fatal(err)
			}
		},
		// Holders and waiters each have a key in the name's directory.
		Waiting: func(name string) int {
			ctx := context.Background()
			resp, err := operator.Get(ctx, prefix+backend.Escape(name)+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
			if err != nil {
				return 0
			}
			info, err := inspector.Inspect(ctx, name)
			if err != nil {
				return 0
			}
			return int(resp.Count) - len(info.Holders)
		},
		NewFactory: func(t testing.TB, opts ...lock.Option) locktest.Factory {
			return factory(t, cli, append([]lock.Option{etcdlock.WithKeyPrefix(prefix)}, opts...)...)
		},
		Breaker: func(t testing.TB) locktest.Breaker { return factory(t, cli, etcdlock.WithKeyPrefix(prefix)) },
		Fence:   func(testing.TB) lock.Fence { return etcdlock.NewFence(cli, etcdlock.WithKeyPrefix(prefix)) },
		FIFO: func(t testing.TB, opts ...lock.Option) lock.Locker {
			return factory(t, cli, etcdlock.WithKeyPrefix(prefix)).AsLocker(opts...)
		},
		Name: "etcdlock",
	})
}

func TestInvalidInput(t *testing.T) {
	ctx := context.Background()
	for _, d := range []time.Duration{500 * time.Millisecond, 1500 * time.Millisecond, time.Second + 1} {
		f := etcdlock.NewFactory(nil, etcdlock.WithTTL(d))
		if _, err := f.Acquire(ctx, "x"); !errors.Is(err, lock.ErrInvalidOption) {
			t.Errorf("factory WithTTL(%v): Acquire = %v; want ErrInvalidOption", d, err)
		}
	}
	f := etcdlock.NewFactory(nil)
	if _, err := f.Acquire(ctx, "x"); !errors.Is(err, lock.ErrInvalidOption) {
		t.Fatalf("Acquire on a factory with a nil client = %v; want ErrInvalidOption", err)
	}
	if _, err := f.Inspect(ctx, "x"); !errors.Is(err, lock.ErrInvalidOption) {
		t.Fatalf("Inspect on a factory with a nil client = %v; want ErrInvalidOption", err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}

	cli := client(t)
	g := factory(t, cli, etcdlock.WithKeyPrefix(testPrefix(t)))
	if _, err := g.Acquire(ctx, "x", etcdlock.WithTTL(2500*time.Millisecond)); !errors.Is(err, lock.ErrInvalidOption) {
		t.Fatalf("per-call WithTTL(2.5s) = %v; want ErrInvalidOption", err)
	}
}

// An operator deleting the key, or revoking the lease, takes the lock away.
func TestOperatorTakesLockAway(t *testing.T) {
	cli := client(t)
	f := factory(t, cli, etcdlock.WithKeyPrefix(testPrefix(t)))
	ctx := ctxT(t, time.Minute)

	h, err := f.Acquire(ctx, "deleted")
	if err != nil {
		t.Fatal(err)
	}
	other, err := f.Acquire(ctx, "bystander")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Delete(ctx, h.Key()); err != nil {
		t.Fatal(err)
	}
	waitClosed(t, h.Done(), 10*time.Second, "loss after the key was deleted")
	if !errors.Is(h.Err(), etcdlock.ErrLockLost) {
		t.Fatalf("Err = %v", h.Err())
	}
	if other.Err() != nil {
		t.Fatalf("deleting one key took another lock on the same lease: %v", other.Err())
	}
	if err := h.Release(); !errors.Is(err, lock.ErrLockLost) {
		t.Fatalf("Release after loss = %v", err)
	}
	if err := other.Release(); err != nil {
		t.Fatal(err)
	}

	// Revoking the lease ends every lock on it; later acquires get a new
	// lease.
	a, err := f.Acquire(ctx, "revoked-a")
	if err != nil {
		t.Fatal(err)
	}
	b, err := f.Acquire(ctx, "revoked-b")
	if err != nil {
		t.Fatal(err)
	}
	if a.Lease() != b.Lease() {
		t.Fatalf("two locks of one factory use leases %x and %x; want one shared lease", a.Lease(), b.Lease())
	}
	if _, err := cli.Revoke(ctx, a.Lease()); err != nil {
		t.Fatal(err)
	}
	waitClosed(t, a.Done(), 10*time.Second, "loss of a after the lease was revoked")
	waitClosed(t, b.Done(), 10*time.Second, "loss of b after the lease was revoked")
	c, err := f.Acquire(ctx, "revoked-a")
	if err != nil {
		t.Fatal(err)
	}
	if c.Lease() == a.Lease() {
		t.Fatal("a revoked lease was used again")
	}
	if c.Token() <= a.Token() {
		t.Fatalf("token %d after %d", c.Token(), a.Token())
	}
	if err := c.Release(); err != nil {
		t.Fatal(err)
	}
}

func TestInspectDetails(t *testing.T) {
	cli := client(t)
	prefix := testPrefix(t)
	f := factory(t, cli, etcdlock.WithKeyPrefix(prefix), etcdlock.WithTTL(30*time.Second))
	ctx := ctxT(t, time.Minute)
	h, err := f.Acquire(ctx, "inspected", etcdlock.WithMaxConcurrent(2),
		etcdlock.WithOwner("job-7"), etcdlock.WithMetadata("shard", "3"))
	if err != nil {
		t.Fatal(err)
	}
	info, err := f.Inspect(ctx, "inspected")
	if err != nil {
		t.Fatal(err)
	}
	if info.Limit != 2 || len(info.Holders) != 1 {
		t.Fatalf("Inspect = %+v; want limit 2 and one holder", info)
	}
	hi := info.Holders[0]
	if hi.Token != h.Token() || hi.Owner != "job-7" || hi.Metadata["shard"] != "3" {
		t.Fatalf("holder info %+v", hi)
	}
	if left := time.Until(hi.Expires); left <= 0 || left > 31*time.Second {
		t.Fatalf("expires in %v; want within the 30s TTL", left)
	}
	if hi.Since.IsZero() || time.Since(hi.Since) > time.Minute {
		t.Fatalf("since %v", hi.Since)
	}
	h.Release()
}

// Key names are used again, so that a busy name does not fill etcd's index
// with deleted keys; a leftover key under a name this factory would use is
// skipped, and holds the lock while it exists.
func TestKeyNamesReused(t *testing.T) {
	cli := client(t)
	f := factory(t, cli, etcdlock.WithKeyPrefix(testPrefix(t)))
	ctx := ctxT(t, time.Minute)
	var key string
	var last uint64
	for i := 0; i < 3; i++ {
		h, err := f.Acquire(ctx, "reused")
		if err != nil {
			t.Fatal(err)
		}
		if i > 0 && h.Key() != key {
			t.Fatalf("acquire %d used key %q, earlier %q", i, h.Key(), key)
		}
		if h.Token() <= last {
			t.Fatalf("token %d after %d", h.Token(), last)
		}
		key, last = h.Key(), h.Token()
		if err := h.Release(); err != nil {
			t.Fatal(err)
		}
	}
	// A leftover under that name (as a lost lock's key can be until its
	// lease runs out) is not taken over.
	if _, err := cli.Put(ctx, key, "leftover"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Acquire(ctx, "reused"); !errors.Is(err, etcdlock.ErrLocked) {
		t.Fatalf("Acquire with a leftover key = %v; want ErrLocked", err)
	}
	if _, err := cli.Delete(ctx, key); err != nil {
		t.Fatal(err)
	}
	h, err := f.Acquire(ctx, "reused")
	if err != nil {
		t.Fatal(err)
	}
	if h.Token() <= last {
		t.Fatalf("token %d after %d", h.Token(), last)
	}
	h.Release()
}

// An idle lease is taken up again rather than granted anew.
func TestIdleLeaseReused(t *testing.T) {
	cli := client(t)
	f := factory(t, cli, etcdlock.WithKeyPrefix(testPrefix(t)), etcdlock.WithTTL(30*time.Second))
	ctx := ctxT(t, time.Minute)
	h, err := f.Acquire(ctx, "idle")
	if err != nil {
		t.Fatal(err)
	}
	h.Release()
	if f.Renewing() != 1 {
		t.Fatalf("%d leases renewed just after the release; want the idle one, lingering", f.Renewing())
	}
	testenv.Eventually(t, 30*time.Second, "the idle lease's renewal stopped", func() bool { return f.Renewing() == 0 })
	h2, err := f.Acquire(ctx, "idle")
	if err != nil {
		t.Fatal(err)
	}
	if h2.Lease() != h.Lease() {
		t.Fatalf("lease %x after %x; want the idle lease taken up again", h2.Lease(), h.Lease())
	}
	h2.Release()
}

// A waiter whose key is deleted by an operator queues again and is still
// served.
func TestWaiterKeyDeleted(t *testing.T) {
	cli := client(t)
	prefix := testPrefix(t)
	f := factory(t, cli, etcdlock.WithKeyPrefix(prefix))
	g := factory(t, cli, etcdlock.WithKeyPrefix(prefix))
	ctx := ctxT(t, time.Minute)
	h, err := f.Acquire(ctx, "w")
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan *etcdlock.Holder, 1)
	go func() {
		w, err := g.Acquire(ctx, "w", etcdlock.WithWait())
		if err != nil {
			t.Error(err)
		}
		got <- w
	}()
	var waiterKey string
	testenv.Eventually(t, 30*time.Second, "the waiter's key", func() bool {
		resp, err := cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
		if err != nil {
			t.Fatal(err)
		}
		for _, kv := range resp.Kvs {
			if string(kv.Key) != h.Key() {
				waiterKey = string(kv.Key)
			}
		}
		return waiterKey != ""
	})
	if _, err := cli.Delete(ctx, waiterKey); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "the waiter back in the queue", func() bool {
		resp, err := cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		return resp.Count == 2
	})
	select {
	case <-got:
		t.Fatal("the waiter acquired while the lock was held")
	default:
	}
	h.Release()
	w := <-got
	if w == nil {
		t.FailNow()
	}
	if w.Token() <= h.Token() {
		t.Fatalf("token %d after %d", w.Token(), h.Token())
	}
	w.Release()
}

// After Close, nothing the factory started is left running.
func TestCloseLeavesNoGoroutines(t *testing.T) {
	cli := client(t)
	prefix := testPrefix(t)
	time.Sleep(50 * time.Millisecond)
	base := runtime.NumGoroutine()
	f := etcdlock.NewFactory(cli, etcdlock.WithKeyPrefix(prefix), etcdlock.WithTTL(5*time.Second))
	ctx := ctxT(t, time.Minute)
	h, err := f.Acquire(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Acquire(ctx, "b", etcdlock.WithMaxConcurrent(2), etcdlock.WithAutoRenew(false)); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := f.Acquire(wctx, "a", etcdlock.WithWait()); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("wait on a held lock = %v", err)
	}
	h.Extend(ctx)
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if !testenv.Poll(5*time.Second, func() bool { return runtime.NumGoroutine() <= base }) {
		buf := make([]byte, 1<<16)
		t.Fatalf("%d goroutines after Close, %d before:\n%s", runtime.NumGoroutine(), base, buf[:runtime.Stack(buf, true)])
	}
}

// A storm of waiters whose deadlines are shorter than an etcd write, each
// retrying at once, as separate processes would (a factory and a client
// each): there is never more than one key per contender under the name,
// none is left a second after the last caller returns, and a fresh factory
// then takes the lock at once. "slow" delays every transaction by 10ms (a
// slow disk), so that most writes outlive their caller.
func TestAbandonedWaitsLeaveNothing(t *testing.T) {
	testenv.SkipShort(t, "etcd")
	storm := 8 * time.Second
	if os.Getenv("CI") != "" {
		storm = 3 * time.Second
	}
	for _, c := range []struct {
		name string
		n    int
		slow time.Duration
	}{{"8", 8, 0}, {"64", 64, 0}, {"8-slow", 8, 10 * time.Millisecond}} {
		t.Run(c.name, func(t *testing.T) {
			prefix := testPrefix(t)
			ctx := ctxT(t, time.Minute)
			delay := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoke grpc.UnaryInvoker, opts ...grpc.CallOption) error {
				if strings.HasSuffix(method, "/Txn") {
					time.Sleep(c.slow)
				}
				return invoke(ctx, method, req, reply, cc, opts...)
			}
			fs := make([]*etcdlock.Factory, c.n)
			for i := range fs {
				cli, err := clientv3.New(clientv3.Config{
					Endpoints:   testenv.EtcdEndpoints(),
					DialTimeout: 3 * time.Second,
					Logger:      zap.NewNop(),
					DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(delay)},
				})
				if err != nil {
					testenv.Unavailable(t, "etcd", err)
				}
				t.Cleanup(func() { cli.Close() })
				fs[i] = factory(t, cli, etcdlock.WithKeyPrefix(prefix))
			}
			cli := client(t)
			count := func() (int64, error) {
				resp, err := cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
				if err != nil {
					return 0, err
				}
				return resp.Count, nil
			}
			var acquired, locked, other atomic.Int64
			var wg sync.WaitGroup
			end := time.Now().Add(storm)
			for _, f := range fs {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for time.Now().Before(end) {
						d := 200*time.Microsecond + rand.N(2800*time.Microsecond)
						actx, cancel := context.WithTimeout(ctx, d)
						h, err := f.Acquire(actx, "storm", etcdlock.WithWait())
						cancel()
						switch {
						case err == nil:
							acquired.Add(1)
							h.Release()
						case errors.Is(err, etcdlock.ErrLocked):
							locked.Add(1)
						default:
							other.Add(1)
						}
					}
				}()
			}
			// The most keys seen at once while the storm runs.
			var most int64
			var countErr error
			sampled := make(chan struct{})
			go func() {
				defer close(sampled)
				for time.Now().Before(end) && countErr == nil {
					var n int64
					n, countErr = count()
					most = max(most, n)
					time.Sleep(time.Millisecond)
				}
			}()
			wg.Wait()
			<-sampled
			returned := time.Now()
			// The keys go within a round trip or two (tens of ms, logged);
			// the bound is a guard against a pile-up on a loaded machine,
			// not a timing target.
			deadline := returned.Add(10 * time.Second)
			if countErr != nil {
				t.Fatal(countErr)
			}
			keys, err := count()
			if err != nil {
				t.Fatal(err)
			}
			left := keys
			testenv.Poll(time.Until(deadline), func() bool {
				if left, err = count(); err != nil {
					t.Fatal(err)
				}
				return left == 0
			})
			t.Logf("%d contenders, %v: %d acquired, %d ErrLocked, %d other errors; at most %d keys at once, %d when the last caller returned, %d after %v",
				c.n, storm, acquired.Load(), locked.Load(), other.Load(), most, keys, left, time.Since(returned).Round(time.Millisecond))
			if most > int64(c.n) {
				t.Errorf("%d keys under the name at once; want at most one per contender (%d)", most, c.n)
			}
			if left > 0 {
				t.Fatalf("%d keys left under the name 10s after the last caller returned", left)
			}
			fresh := factory(t, cli, etcdlock.WithKeyPrefix(prefix))
			testenv.Poll(time.Until(deadline), func() bool {
				var h *etcdlock.Holder
				if h, err = fresh.Acquire(ctx, "storm"); err == nil {
					h.Release()
				}
				return !errors.Is(err, etcdlock.ErrLocked)
			})
			if err != nil {
				t.Fatalf("a fresh factory's Acquire %v after the last caller returned = %v", time.Since(returned), err)
			}
		})
	}
}

// TestListPages: List reads more names than one page holds, each once and
// in order, and counts a waiter behind a holder.
func TestListPages(t *testing.T) {
	cli := client(t)
	f := factory(t, cli, etcdlock.WithKeyPrefix(testPrefix(t)))
	ctx := ctxT(t, time.Minute)
	var want []string
	for i := range lock.ListPageSize + 2 {
		name := fmt.Sprintf("p/%04d", i)
		h, err := f.Acquire(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		defer h.Release()
		want = append(want, name)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	waited := make(chan error, 1)
	go func() {
		h, err := f.Acquire(wctx, "p/0000", lock.WithWait())
		if err == nil {
			h.Release()
		}
		waited <- err
	}()
	testenv.Eventually(t, 30*time.Second, "the waiter in Inspect's Waiting", func() bool {
		info, err := f.Inspect(ctx, "p/0000")
		return err != nil || info.Waiting == 1
	})
	var got []string
	for info, err := range f.List(ctx, "p/") {
		if err != nil {
			t.Fatal(err)
		}
		if len(info.Holders) != 1 {
			t.Fatalf("List: %+v; want one holder", info)
		}
		if w := map[bool]int{true: 1}[info.Name == "p/0000"]; info.Waiting != w {
			t.Errorf("List: %s has Waiting %d; want %d", info.Name, info.Waiting, w)
		}
		got = append(got, info.Name)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("List yielded %d names; want %d in order, %q to %q", len(got), len(want), want[0], want[len(want)-1])
	}
	cancel()
	<-waited
}
