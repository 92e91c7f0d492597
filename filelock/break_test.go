//go:build unix

package filelock_test

import (
	"context"
	"errors"
	"os"
	"testing"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/filelock"
)

// locktest's Break tests check Break on every kind of lock; here, what
// only the store shows: a Break of a free name writes no fence record.
func TestBreakFreeWritesNothing(t *testing.T) {
	opts := []filelock.Option{filelock.WithDir(t.TempDir()), filelock.WithLogger(nil)}
	if err := newFactory(t, opts...).Break(context.Background(), "free"); !errors.Is(err, lock.ErrNotHeld) {
		t.Errorf("Break of a free name: %v, want ErrNotHeld", err)
	}
	if _, err := os.Stat(filelock.NewFence(opts...).Path("free")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Break of a free name wrote the fence record: %v", err)
	}
}
