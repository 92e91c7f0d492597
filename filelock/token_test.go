//go:build unix

package filelock_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/ubgo/lock/filelock"
)

// TestTokensAfterHostCrash: the counter file is not flushed on every
// acquire, so a host crash may bring it back with an older content, or a
// torn one; the next token is still above every token handed out before
// (backend.NextToken's clock floor). Mutex and semaphore.
func TestTokensAfterHostCrash(t *testing.T) {
	for _, limit := range []int{1, 3} {
		dir := t.TempDir()
		f := newFactory(t, filelock.WithDir(dir), filelock.WithLogger(nil))
		counter := filepath.Join(dir, "t.token")
		var last uint64
		next := func(what string) {
			t.Helper()
			h := mustAcquire(t, f, "t", filelock.WithMaxConcurrent(limit))
			if h.Token() <= last {
				t.Fatalf("limit %d, %s: token %d after %d", limit, what, h.Token(), last)
			}
			last = h.Token()
			h.Release()
		}
		next("first")
		old, err := os.ReadFile(counter)
		if err != nil {
			t.Fatal(err)
		}
		for range 5 {
			next("fresh")
		}
		os.WriteFile(counter, old, 0o644) // a crash took the last writes back
		next("after the counter was reverted")
		os.WriteFile(counter, old[:len(old)/2], 0o644) // a torn write
		next("after the counter was torn")
		os.WriteFile(counter, old, 0o644)
		next("after a second revert")
	}
}
