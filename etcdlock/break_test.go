package etcdlock_test

import (
	"errors"
	"testing"
	"time"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/etcdlock"
)

// locktest's Break tests check Break on every kind of lock; here, what
// only the store shows: a Break of a free name writes no fence record.
func TestBreakFreeWritesNothing(t *testing.T) {
	cli := client(t)
	ctx := ctxT(t, time.Minute)
	opts := []etcdlock.Option{etcdlock.WithKeyPrefix(testPrefix(t)), etcdlock.WithLogger(nil)}
	if err := factory(t, cli, opts...).Break(ctx, "free"); !errors.Is(err, lock.ErrNotHeld) {
		t.Errorf("Break of a free name: %v, want ErrNotHeld", err)
	}
	if resp, err := cli.Get(ctx, etcdlock.NewFence(cli, opts...).Key("free")); err != nil || len(resp.Kvs) != 0 {
		t.Errorf("Break of a free name wrote the fence record: %v %v", resp, err)
	}
}
