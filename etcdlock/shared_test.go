package etcdlock_test

import (
	"testing"
	"time"

	"github.com/ubgo/lock/etcdlock"
)

// Inspect of a name held shared lists its readers as holders and a writer
// queued behind them as waiting; a reader that comes after the writer
// waits too, and is served after it.
func TestInspectShared(t *testing.T) {
	cli := client(t)
	prefix := testPrefix(t)
	f := factory(t, cli, etcdlock.WithKeyPrefix(prefix))
	ctx := ctxT(t, time.Minute)
	r1, err := f.Acquire(ctx, "schema", etcdlock.WithShared(), etcdlock.WithOwner("r1"))
	if err != nil {
		t.Fatal(err)
	}
	r2, err := factory(t, cli, etcdlock.WithKeyPrefix(prefix)).Acquire(ctx, "schema", etcdlock.WithShared(), etcdlock.WithOwner("r2"))
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		w, err := factory(t, cli, etcdlock.WithKeyPrefix(prefix)).Acquire(ctx, "schema", etcdlock.WithWait())
		if err == nil {
			err = w.Release()
		}
		got <- err
	}()
	if info := waitWaiting(t, f, "schema", 1); len(info.Holders) != 2 || info.Holders[0].Owner != "r1" || info.Holders[1].Owner != "r2" || info.Limit != 1 {
		t.Fatalf("Inspect with two readers and a waiting writer = %+v", info)
	}
	r1.Release()
	r2.Release()
	if err := <-got; err != nil {
		t.Fatalf("writer: %v", err)
	}
}
