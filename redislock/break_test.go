package redislock

import (
	"errors"
	"testing"

	"github.com/ubgo/lock"
)

// locktest's Break tests check Break on every kind of lock, on one server
// and on a cluster; here, what only the store shows: a Break of a free
// name writes no fence record.
func TestBreakFreeWritesNothing(t *testing.T) {
	rdb := newClient(t)
	ctx := ctxT(t)
	name := uniq(t, "free")
	if err := testFactory(t, rdb).Break(ctx, name); !errors.Is(err, lock.ErrNotHeld) {
		t.Errorf("Break of a free name: %v, want ErrNotHeld", err)
	}
	if n, _ := rdb.Exists(ctx, NewFence(rdb, WithKeyPrefix(testPrefix)).Key(name)).Result(); n != 0 {
		t.Errorf("Break of a free name wrote the fence record")
	}
}
