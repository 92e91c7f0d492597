package dirwatch

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ubgo/lock/internal/testenv"
)

func TestNameOf(t *testing.T) {
	for file, want := range map[string]string{
		"job.lock": "job", "job.3.lock": "job", "a%2Fb.12.lock": "a%2Fb",
		"job.token": "", "job.x.lock": "", "job..lock": "", ".lock": "", "job": "", "job.3.lock.tmp": "",
	} {
		if got := nameOf(file); got != want {
			t.Errorf("nameOf(%q) = %q, want %q", file, got, want)
		}
	}
}

// A lock file closed after writing, deleted or renamed away wakes the
// name's waiters; the events come through inotify, as they would from
// another process.
func TestFileEvents(t *testing.T) {
	dir := t.TempDir()
	s := Subscribe(dir, "job")
	defer s.Close()
	if !s.Watched() {
		t.Fatal("not watched on Linux")
	}
	path := filepath.Join(dir, "job.2.lock")
	ch := s.Wake()
	if err := os.WriteFile(path, []byte("x"), 0o666); err != nil {
		t.Fatal(err)
	}
	woken(t, ch, "a close after writing")
	ch = s.Wake()
	if err := os.Rename(path, filepath.Join(dir, "moved")); err != nil {
		t.Fatal(err)
	}
	woken(t, ch, "a rename")
	if err := os.WriteFile(path, nil, 0o666); err != nil {
		t.Fatal(err)
	}
	ch = s.Wake()
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	woken(t, ch, "a delete")
}

// The watch of a directory stops a moment after its last waiter leaves
// (and Watching says so), and a later waiter gets a new one.
func TestWatchRetires(t *testing.T) {
	dir := t.TempDir()
	s := Subscribe(dir, "job")
	mu.Lock()
	w := hubs[dir].w
	mu.Unlock()
	if !Watching(dir) {
		t.Fatal("Watching is false while a waiter waits")
	}
	s.Close()
	select {
	case <-w.done:
	case <-time.After(30 * time.Second):
		t.Fatal("the watch outlived its last waiter")
	}
	testenv.Eventually(t, 10*time.Second, "Watching false once the watch stopped", func() bool { return !Watching(dir) })
	s = Subscribe(dir, "job")
	defer s.Close()
	ch := s.Wake()
	if err := os.WriteFile(filepath.Join(dir, "job.lock"), nil, 0o666); err != nil {
		t.Fatal(err)
	}
	woken(t, ch, "a close after writing, on a new watch")
}
