//go:build linux

package flock

import (
	"os"
	"path/filepath"
	"testing"
)

// A board truncated by hand while mapped must not kill the process: its
// faults read as "someone may wait" and "cannot count".
func TestBoardTruncatedByHand(t *testing.T) {
	dir := t.TempDir()
	b := holdBoard(dir)
	if b == nil {
		t.Skip("no board on this file system")
	}
	defer b.drop()
	if othersWait(b, "x") {
		t.Fatal("a fresh board says someone waits")
	}
	if err := os.Truncate(filepath.Join(dir, boardFile), 0); err != nil {
		t.Fatal(err)
	}
	if !othersWait(b, "x") {
		t.Error("a truncated board says nobody waits: a release would keep its descriptor and leave waiters to their poll")
	}
	done, ok := countWaiter(dir, "x")
	done()
	if ok {
		t.Error("a waiter was counted on a truncated board")
	}
}
