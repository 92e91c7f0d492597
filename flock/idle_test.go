package flock

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"
)

func idleHas(dir, name string) bool {
	idle.Lock()
	defer idle.Unlock()
	e := idle.m[idleKey{dir, name}]
	return e != nil && e.fd != noFile
}

func mustTake(t *testing.T, f *Factory, name string) *Holder {
	t.Helper()
	h, err := f.Acquire(context.Background(), name)
	if err != nil {
		t.Fatalf("Acquire(%q): %v", name, err)
	}
	return h
}

func requireKeep(t *testing.T) {
	if !sysKeepOpen {
		t.Skip("releases close their files here")
	}
}

// A released mutex's descriptor is kept for the next Acquire, which takes
// it out of the cache: a second Acquire of the name in the process opens
// its own and conflicts, through the same factory or another. Close
// closes what the factory kept.
func TestIdleDescriptorIsOneHolders(t *testing.T) {
	requireKeep(t)
	dir := t.TempDir()
	f := NewFactory(WithDir(dir), WithLogger(nil))
	g := NewFactory(WithDir(dir), WithLogger(nil))
	defer g.Close()
	mustTake(t, f, "n").Release()
	if !idleHas(dir, "n") {
		t.Fatal("release kept no descriptor")
	}
	h := mustTake(t, f, "n")
	if idleHas(dir, "n") {
		t.Fatal("a held descriptor is still idle")
	}
	for _, l := range []*Factory{f, g} {
		if _, err := l.Acquire(context.Background(), "n"); !errors.Is(err, ErrLocked) {
			t.Fatalf("second Acquire while held = %v", err)
		}
	}
	h.Release()
	mustTake(t, g, "n").Release() // g takes f's idle descriptor, and keeps it as its own
	mustTake(t, f, "m").Release()
	f.Close()
	if !idleHas(dir, "n") || idleHas(dir, "m") {
		t.Fatal("Close closed another factory's idle descriptor, or left its own")
	}
}

// An idle descriptor whose file was deleted or moved away by hand is not
// locked again: the next Acquire opens the path, and so conflicts with
// everyone else's new file.
func TestIdleDescriptorOfRemovedFile(t *testing.T) {
	requireKeep(t)
	for _, tc := range []struct {
		name   string
		check  time.Duration
		remove func(path string) error
	}{
		{"deleted", time.Hour, os.Remove},
		{"replaced", time.Hour, func(p string) error {
			if err := os.WriteFile(p+".new", nil, 0o644); err != nil {
				return err
			}
			return os.Rename(p+".new", p)
		}},
		{"moved away", time.Millisecond, func(p string) error { return os.Rename(p, p+".moved") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			f := NewFactory(WithDir(dir), WithLogger(nil), WithCheckInterval(tc.check))
			defer f.Close()
			g := NewFactory(WithDir(dir), WithLogger(nil))
			defer g.Close()
			mustTake(t, f, "n").Release()
			path := filepath.Join(dir, "n.lock")
			if err := tc.remove(path); err != nil {
				t.Fatal(err)
			}
			time.Sleep(5 * time.Millisecond) // past f's check interval, for "moved away"
			h := mustTake(t, f, "n")
			defer h.Release()
			if same, err := sysSameFile(h.nameFd, path); err != nil || !same {
				t.Fatalf("holder's file is not the one at the path (%v)", err)
			}
			if _, err := g.Acquire(context.Background(), "n"); !errors.Is(err, ErrLocked) {
				t.Fatalf("Acquire by another factory = %v: two holders", err)
			}
		})
	}
}

// A release finds a waiter counted on its name and closes its descriptor,
// the event inotify gives waiters in other processes.
func TestReleaseClosesForCountedWaiter(t *testing.T) {
	requireKeep(t)
	if runtime.GOOS != "linux" {
		t.Skip("waiters poll here: there is no event to make")
	}
	dir := t.TempDir()
	f := NewFactory(WithDir(dir), WithLogger(nil))
	defer f.Close()
	mustTake(t, f, "n").Release() // makes the board
	done, ok := countWaiter(dir, "n")
	if !ok {
		t.Fatal("no board")
	}
	mustTake(t, f, "n").Release()
	if idleHas(dir, "n") {
		t.Fatal("release kept its descriptor with a waiter counted")
	}
	done()
	mustTake(t, f, "n").Release()
	if !idleHas(dir, "n") {
		t.Fatal("release closed its descriptor with no waiter counted")
	}
}

// The cache holds at most maxIdle descriptors.
func TestIdleCacheIsBounded(t *testing.T) {
	requireKeep(t)
	dir := t.TempDir()
	f := NewFactory(WithDir(dir), WithLogger(nil))
	defer f.Close()
	for i := range maxIdle + 10 {
		mustTake(t, f, "n"+string(rune('a'+i%26))+string(rune('a'+i/26))).Release()
	}
	idle.Lock()
	n := len(idle.m)
	idle.Unlock()
	if n > maxIdle {
		t.Fatalf("%d idle descriptors, at most %d", n, maxIdle)
	}
}
