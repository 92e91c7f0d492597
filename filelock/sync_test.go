//go:build unix

package filelock_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/ubgo/lock/filelock"
)

// An acquire syncs its marker after letting go of the name's guard: while
// the sync is stuck, others still look at the name (and find it held);
// the Acquire returns once the sync is done, and one whose sync fails
// removes its marker and holds nothing.
func TestMarkerSyncOutsideGuard(t *testing.T) {
	dir := t.TempDir()
	f := newFactory(t, filelock.WithDir(dir), filelock.WithLogger(nil))
	marker := filepath.Join(dir, "disk.lock")
	stalled, unstall := make(chan struct{}), make(chan struct{})
	var once sync.Once
	var fail bool
	filelock.SetSyncHook(func(path string) error {
		if path != marker {
			return nil
		}
		once.Do(func() { close(stalled) })
		<-unstall
		if fail {
			return unix.EIO
		}
		return nil
	})
	defer filelock.SetSyncHook(nil)

	type result struct {
		h   *filelock.Holder
		err error
	}
	acquire := func() <-chan result {
		c := make(chan result, 1)
		go func() {
			h, err := f.Acquire(context.Background(), "disk")
			c <- result{h, err}
		}()
		return c
	}
	c := acquire()
	<-stalled
	other := newFactory(t, filelock.WithDir(dir), filelock.WithLogger(nil))
	mustLocked(t, other, "disk") // the guard is free, the marker already there
	close(unstall)
	r := <-c
	if r.err != nil {
		t.Fatal(r.err)
	}
	r.h.Release()

	stalled, unstall = make(chan struct{}), make(chan struct{})
	once, fail = sync.Once{}, true
	c = acquire()
	<-stalled
	close(unstall)
	if r := <-c; !errors.Is(r.err, unix.EIO) {
		t.Fatalf("Acquire whose marker sync failed = %v, %v; want EIO", r.h, r.err)
	}
	if _, err := os.Stat(marker); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the marker of an Acquire whose sync failed is still there: %v", err)
	}
	filelock.SetSyncHook(nil)
	mustAcquire(t, other, "disk").Release()
}
