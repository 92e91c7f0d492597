package etcdlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/backend"
	"github.com/ubgo/lock/etcdlock"
	"github.com/ubgo/lock/locktest"
)

// storePrefix is a key prefix of one test, whose keys are deleted when the
// test ends: fence and ledger records have no lease, and the server is
// shared.
func storePrefix(t testing.TB) string {
	t.Helper()
	prefix := testPrefix(t)
	cli := client(t)
	t.Cleanup(func() { cli.Delete(context.Background(), prefix, clientv3.WithPrefix()) })
	return prefix
}

// Each constructor call gets a client of its own, as another process would.
func TestFenceConformance(t *testing.T) {
	prefix := storePrefix(t)
	locktest.RunFence(t, func(t testing.TB) lock.Fence {
		return etcdlock.NewFence(client(t), etcdlock.WithKeyPrefix(prefix))
	})
}

func TestLedgerConformance(t *testing.T) {
	prefix := storePrefix(t)
	locktest.RunLedger(t, func(t testing.TB) lock.Ledger {
		return etcdlock.NewLedger(client(t), etcdlock.WithKeyPrefix(prefix))
	})
}

// The records sit outside every lock's directory (a lock named "fence" or
// ".fence" does not see them), carry no lease, and hold the token as stored.
func TestFenceAndLedgerKeys(t *testing.T) {
	cli := client(t)
	ctx := ctxT(t, time.Minute)
	prefix := storePrefix(t)
	f := etcdlock.NewFence(cli, etcdlock.WithKeyPrefix(prefix))
	l := etcdlock.NewLedger(cli, etcdlock.WithKeyPrefix(prefix))
	for _, name := range []string{"fence", ".fence", "x"} {
		if want := prefix + ".fence/" + backend.Escape(name); f.Key(name) != want {
			t.Fatalf("fence key %q, want %q", f.Key(name), want)
		}
		if err := f.RejectIfStale(ctx, name, 1<<63+5); err != nil {
			t.Fatal(err)
		}
		if err := l.MarkDone(ctx, name, 42); err != nil {
			t.Fatal(err)
		}
	}
	for k, want := range map[string]string{f.Key("x"): "09223372036854775813", l.Key("x"): "42"} {
		resp, err := cli.Get(ctx, k)
		if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != want || resp.Kvs[0].Lease != 0 {
			t.Fatalf("%s: %v %v; want %q without a lease", k, resp, err, want)
		}
	}
	// Locks named like the records' directories are untouched by them.
	fac := factory(t, cli, etcdlock.WithKeyPrefix(prefix))
	for _, name := range []string{"fence", ".fence", "done", ".done"} {
		h, err := fac.Acquire(ctx, name)
		if err != nil {
			t.Fatalf("lock %q: %v", name, err)
		}
		info, err := fac.Inspect(ctx, name)
		if err != nil || len(info.Holders) != 1 || info.Limit != 1 {
			t.Fatalf("lock %q: %+v %v; the records must not look like holders", name, info, err)
		}
		h.Release()
	}
	// List sees the locks, not the records beside them.
	h, err := fac.Acquire(ctx, "y")
	if err != nil {
		t.Fatal(err)
	}
	var listed []string
	for info, err := range fac.List(ctx, "") {
		if err != nil {
			t.Fatal(err)
		}
		listed = append(listed, info.Name)
	}
	if len(listed) != 1 || listed[0] != "y" {
		t.Fatalf("List with fence and ledger records beside one lock: %q; want [y]", listed)
	}
	h.Release()
	// The operator's re-run: delete the record.
	if _, err := cli.Delete(ctx, l.Key("x")); err != nil {
		t.Fatal(err)
	}
	if done, err := l.IsDone(ctx, "x"); done || err != nil {
		t.Fatalf("after delete: done %v err %v", done, err)
	}
	if k := etcdlock.NewFence(cli).Key("a/b"); k != etcdlock.DefaultKeyPrefix+".fence/a%2Fb" {
		t.Fatalf("default fence key %q", k)
	}
}

// Apply puts the caller's writes in the fence's Txn: they land only with a
// token that is not stale.
func TestFenceApply(t *testing.T) {
	cli := client(t)
	ctx := ctxT(t, time.Minute)
	prefix := storePrefix(t)
	f := etcdlock.NewFence(cli, etcdlock.WithKeyPrefix(prefix))
	data := prefix + "data"
	if err := f.Apply(ctx, "k", 7, clientv3.OpPut(data, "seven")); err != nil {
		t.Fatal(err)
	}
	if err := f.Apply(ctx, "k", 6, clientv3.OpPut(data, "six")); !errors.Is(err, lock.ErrStaleToken) {
		t.Fatalf("stale Apply: %v", err)
	}
	resp, err := cli.Get(ctx, data)
	if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "seven" {
		t.Fatalf("data after a stale Apply: %v %v; want \"seven\"", resp, err)
	}
}

func TestFenceAndLedgerBadInput(t *testing.T) {
	ctx := context.Background()
	if err := etcdlock.NewFence(nil).RejectIfStale(ctx, "k", 1); !errors.Is(err, lock.ErrInvalidOption) {
		t.Errorf("nil client: %v", err)
	}
	if err := etcdlock.NewFence(client(t), etcdlock.WithTTL(-1)).RejectIfStale(ctx, "k", 1); !errors.Is(err, lock.ErrInvalidOption) {
		t.Errorf("bad option: %v", err)
	}
	if err := etcdlock.NewFence(client(t)).RejectIfStale(ctx, "", 1); !errors.Is(err, lock.ErrInvalidName) {
		t.Errorf("empty key: %v", err)
	}
	l := etcdlock.NewLedger(nil)
	if done, err := l.IsDone(ctx, "k"); done || !errors.Is(err, lock.ErrInvalidOption) {
		t.Errorf("nil client Done: %v %v", done, err)
	}
	if err := l.MarkDone(ctx, "k", 1); !errors.Is(err, lock.ErrInvalidOption) {
		t.Errorf("nil client MarkDone: %v", err)
	}
}

// Replicas of lock.RunOnce, each with its own client, factory and ledger.
func TestRunOnceLateReplica(t *testing.T) {
	prefix := storePrefix(t)
	locktest.RunOnceReplicas(t, func(t testing.TB, opts ...lock.Option) lock.Locker {
		return factory(t, client(t), etcdlock.WithKeyPrefix(prefix), etcdlock.WithLogger(nil)).AsLocker(opts...)
	}, func(t testing.TB) lock.Ledger { return etcdlock.NewLedger(client(t), etcdlock.WithKeyPrefix(prefix)) })
}

// Holder A, on a lease only Extend renews, stops extending: its lease runs
// out, B takes the lock with a larger token and writes through the fence,
// and A's late write with its old token is refused.
func TestFenceStaleWriter(t *testing.T) {
	ctx := ctxT(t, time.Minute)
	prefix := storePrefix(t)
	fa := factory(t, client(t), etcdlock.WithKeyPrefix(prefix), etcdlock.WithLogger(nil))
	fb := factory(t, client(t), etcdlock.WithKeyPrefix(prefix), etcdlock.WithLogger(nil))
	a, err := fa.Acquire(ctx, "export", etcdlock.WithTTL(time.Second), etcdlock.WithAutoRenew(false))
	if err != nil {
		t.Fatal(err)
	}
	locktest.RunStaleWriter(t, ctx, locktest.StaleWriter{Name: "export", A: a,
		FenceA:   etcdlock.NewFence(client(t), etcdlock.WithKeyPrefix(prefix)),
		FenceB:   etcdlock.NewFence(client(t), etcdlock.WithKeyPrefix(prefix)),
		TakeOver: func() (lock.Holder, error) { return fb.Acquire(ctx, "export", etcdlock.WithWait()) }})
}

// A holder's write lands together with its fencing token in one Txn, or not
// at all if a newer holder has written.
func ExampleFence_Apply() {
	ctx := context.Background()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:2379"}})
	if err != nil {
		return
	}
	defer cli.Close()
	locks := etcdlock.NewFactory(cli)
	defer locks.Close()
	fence := etcdlock.NewFence(cli)

	h, err := locks.Acquire(ctx, "exports/today")
	if err != nil {
		return
	}
	defer h.Release()
	err = fence.Apply(ctx, "exports/today", h.Token(), clientv3.OpPut("exports/today/data", "…"))
	if errors.Is(err, lock.ErrStaleToken) {
		return // a newer holder has written: drop ours
	}
}
