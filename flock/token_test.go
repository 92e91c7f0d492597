package flock_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/ubgo/lock/flock"
)

// TestTokensAfterHostCrash: lock files are not flushed to disk, so a host
// crash may bring one back with an older content, or a torn one; the next
// token is still above every token handed out before (backend.NextToken's
// clock floor). Mutex and semaphore.
func TestTokensAfterHostCrash(t *testing.T) {
	for _, limit := range []int{1, 3} {
		f, dir := newFactory(t)
		file := filepath.Join(dir, "t.lock")
		var last uint64
		next := func(what string) {
			t.Helper()
			h := mustAcquire(t, f, "t", flock.WithMaxConcurrent(limit))
			if h.Token() <= last {
				t.Fatalf("limit %d, %s: token %d after %d", limit, what, h.Token(), last)
			}
			last = h.Token()
			h.Release()
		}
		next("first")
		old, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for range 5 {
			next("fresh")
		}
		os.WriteFile(file, old, 0o644) // a crash took the last writes back
		next("after the lock file was reverted")
		os.WriteFile(file, old[:len(old)/2], 0o644) // a torn write
		next("after the lock file was torn")
		os.WriteFile(file, old, 0o644)
		next("after a second revert")
	}
}
