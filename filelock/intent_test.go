//go:build unix

package filelock_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ubgo/lock/filelock"
	"github.com/ubgo/lock/internal/testenv"
)

// A writer that waits for another writer writes no intent, so readers
// that wait beside it are not kept out; one that waits for readers does.
func TestIntentOnlyForReaders(t *testing.T) {
	dir := t.TempDir()
	want := filepath.Join(dir, "x.want")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	waitFor := func(f *filelock.Factory) <-chan *filelock.Holder {
		c := make(chan *filelock.Holder, 1)
		go func() {
			h, err := f.Acquire(ctx, "x", filelock.WithWait())
			if err != nil {
				t.Error(err)
			}
			c <- h
		}()
		return c
	}
	for _, held := range []struct {
		what   string
		opts   []filelock.Option
		intent bool
	}{
		{"a writer", nil, false},
		{"a reader", []filelock.Option{filelock.WithShared()}, true},
	} {
		h := mustAcquire(t, newFactory(t, filelock.WithDir(dir), filelock.WithLogger(nil)), "x", held.opts...)
		wf := newFactory(t, filelock.WithDir(dir), filelock.WithLogger(nil))
		c := waitFor(wf)
		// It subscribes after its first look, which writes an intent if
		// it writes one.
		testenv.Eventually(t, 30*time.Second, "the writer waits", func() bool { return filelock.Waiting(dir, "x") == 1 })
		_, err := os.Stat(want)
		if got := err == nil; got != held.intent {
			t.Errorf("a writer waiting for %s: intent written %v; want %v", held.what, got, held.intent)
		}
		h.Release()
		(<-c).Release()
	}
}
