package flock_test

import (
	"bytes"
	"context"
	"os"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/ubgo/lock/flock"
)

// closeEvents delivers the names of the files in dir closed after writing,
// as a waiter's inotify watch sees them.
func closeEvents(t *testing.T, dir string) <-chan string {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC)
	if err != nil {
		t.Skipf("no inotify: %v", err)
	}
	if _, err := unix.InotifyAddWatch(fd, dir, unix.IN_CLOSE_WRITE); err != nil {
		unix.Close(fd)
		t.Skipf("no inotify: %v", err)
	}
	f := os.NewFile(uintptr(fd), "inotify")
	t.Cleanup(func() { f.Close() })
	names := make(chan string, 100)
	go func() {
		buf := make([]byte, 64<<10)
		for {
			n, err := f.Read(buf)
			if err != nil {
				return
			}
			for b := buf[:n]; len(b) >= unix.SizeofInotifyEvent; {
				ev := (*unix.InotifyEvent)(unsafe.Pointer(&b[0]))
				end := unix.SizeofInotifyEvent + int(ev.Len)
				name, _, _ := bytes.Cut(b[unix.SizeofInotifyEvent:end], []byte{0})
				names <- string(name)
				b = b[end:]
			}
		}
	}()
	return names
}

// A waiter's retries close no file, so waiters do not wake each other
// through inotify; a Release closes the holder's file, the event that
// wakes waiters in other processes.
func TestCloseEvents(t *testing.T) {
	f, dir := newFactory(t)
	h := mustAcquire(t, f, "x")
	events := closeEvents(t, dir)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	got := make(chan error, 2)
	for range 2 {
		go func() {
			w, err := f.Acquire(ctx, "x", flock.WithWait())
			if err == nil {
				w.Release()
			}
			got <- err
		}()
	}
	waitForWaiters(t, f, "x", 2)
	// The waiters poll every few milliseconds meanwhile, and each
	// Signal makes them try again.
	quiet := time.After(300 * time.Millisecond)
	for tick := time.Tick(20 * time.Millisecond); ; {
		select {
		case name := <-events:
			t.Fatalf("%s closed while both waiters retried", name)
		case <-tick:
			flock.SignalForTest(dir, "x")
			continue
		case <-quiet:
		}
		break
	}
	h.Release()
	select {
	case name := <-events:
		if name != "x.lock" {
			t.Fatalf("first close after Release: %s", name)
		}
	case <-time.After(time.Minute):
		t.Fatal("Release closed no file")
	}
	for range 2 {
		if err := <-got; err != nil {
			t.Fatal(err)
		}
	}
}
