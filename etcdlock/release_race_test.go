package etcdlock_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/etcdlock"
)

// hookKV runs onDelete once a transaction that deletes key has committed,
// before its caller sees the reply.
type hookKV struct {
	clientv3.KV
	mu       sync.Mutex
	key      string
	onDelete func()
}

func (kv *hookKV) arm(key string, fn func()) {
	kv.mu.Lock()
	kv.key, kv.onDelete = key, fn
	kv.mu.Unlock()
}

func (kv *hookKV) Txn(ctx context.Context) clientv3.Txn {
	return &hookTxn{Txn: kv.KV.Txn(ctx), kv: kv}
}

type hookTxn struct {
	clientv3.Txn
	kv      *hookKV
	deletes []string
}

func (t *hookTxn) If(cs ...clientv3.Cmp) clientv3.Txn { t.Txn = t.Txn.If(cs...); return t }
func (t *hookTxn) Else(ops ...clientv3.Op) clientv3.Txn {
	t.Txn = t.Txn.Else(ops...)
	return t
}

func (t *hookTxn) Then(ops ...clientv3.Op) clientv3.Txn {
	for _, op := range ops {
		if op.IsDelete() {
			t.deletes = append(t.deletes, string(op.KeyBytes()))
		}
	}
	t.Txn = t.Txn.Then(ops...)
	return t
}

func (t *hookTxn) Commit() (*clientv3.TxnResponse, error) {
	resp, err := t.Txn.Commit()
	if err != nil || !resp.Succeeded {
		return resp, err
	}
	t.kv.mu.Lock()
	var fn func()
	for _, k := range t.deletes {
		if k == t.kv.key && t.kv.onDelete != nil {
			fn, t.kv.onDelete = t.kv.onDelete, nil
		}
	}
	t.kv.mu.Unlock()
	if fn != nil {
		fn()
	}
	return resp, err
}

// An Extend that reads the key after Release deleted it, and whose answer
// comes before Release's, does not make the holder lost: the lock was
// held until it was released.
func TestExtendRacesRelease(t *testing.T) {
	for _, limit := range []int{1, 2} {
		t.Run(map[int]string{1: "mutex", 2: "permit"}[limit], func(t *testing.T) {
			cli := client(t)
			kv := &hookKV{KV: cli.KV}
			cli.KV = kv
			var mu sync.Mutex
			lost := 0
			obs := lock.ObserverFunc(func(_ context.Context, e lock.Event) {
				if e.Op == lock.OpLost {
					mu.Lock()
					lost++
					mu.Unlock()
				}
			})
			f := factory(t, cli, etcdlock.WithKeyPrefix(testPrefix(t)), etcdlock.WithObserver(obs), etcdlock.WithLogger(nil))
			ctx := ctxT(t, time.Minute)
			h, err := f.Acquire(ctx, "x", etcdlock.WithMaxConcurrent(limit))
			if err != nil {
				t.Fatal(err)
			}
			var extendErr error
			ran := false
			kv.arm(h.Key(), func() {
				ran = true
				extendErr = h.Extend(ctx)
			})
			err = h.Release()
			if !ran {
				t.Fatal("the release transaction never committed")
			}
			if err != nil || h.Err() != nil {
				t.Fatalf("Release = %v, Err = %v; want a clean release", err, h.Err())
			}
			if !errors.Is(extendErr, lock.ErrLockLost) {
				t.Fatalf("Extend racing Release = %v, want ErrLockLost", extendErr)
			}
			mu.Lock()
			defer mu.Unlock()
			if lost != 0 {
				t.Fatalf("%d lost events for a lock held until its release", lost)
			}
		})
	}
}
