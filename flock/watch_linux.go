//go:build linux

package flock

import (
	"bytes"
	"os"
	"strings"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// One inotify instance per watched directory and process, shared by all
// waiters there (the per-user limit on instances is small). It is closed
// watchLinger after the last waiter leaves, off the waiters' path: closing
// an inotify descriptor waits for a kernel grace period (milliseconds),
// and a burst of waits should not pay for a new instance each.
const watchLinger = time.Second

var watchers = struct {
	sync.Mutex
	m map[string]*dirWatch
}{m: map[string]*dirWatch{}}

type dirWatch struct {
	refs  int
	f     *os.File
	close *time.Timer // pending close while refs == 0
}

// watchDir starts delivering the directory's lock file events to wake
// until stop is called. ok is false when inotify is unavailable, and
// waiters then rely on polling.
func watchDir(dir string) (stop func(), ok bool) {
	watchers.Lock()
	defer watchers.Unlock()
	w := watchers.m[dir]
	if w == nil {
		fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
		if err != nil {
			return func() {}, false
		}
		// A release closes a file opened for writing; a prune deletes it.
		if _, err := unix.InotifyAddWatch(fd, dir, unix.IN_CLOSE_WRITE|unix.IN_DELETE|unix.IN_ONLYDIR); err != nil {
			unix.Close(fd)
			return func() {}, false
		}
		// Non-blocking, so os.File reads through the runtime poller and
		// Close interrupts a pending Read.
		w = &dirWatch{f: os.NewFile(uintptr(fd), "inotify:"+dir)}
		watchers.m[dir] = w
		go w.run(dir)
	}
	if w.refs++; w.close != nil {
		w.close.Stop()
		w.close = nil
	}
	var once sync.Once
	return func() { once.Do(func() { unwatch(dir, w) }) }, true
}

func unwatch(dir string, w *dirWatch) {
	watchers.Lock()
	defer watchers.Unlock()
	if w.refs--; w.refs == 0 {
		w.close = time.AfterFunc(watchLinger, func() {
			watchers.Lock()
			if w.refs > 0 || watchers.m[dir] != w {
				watchers.Unlock()
				return // taken up again meanwhile
			}
			delete(watchers.m, dir)
			watchers.Unlock()
			w.f.Close()
		})
	}
}

func (w *dirWatch) run(dir string) {
	buf := make([]byte, 64<<10)
	for {
		n, err := w.f.Read(buf)
		if err != nil {
			return // closed by unwatch
		}
		for b := buf[:n]; len(b) >= unix.SizeofInotifyEvent; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&b[0]))
			end := unix.SizeofInotifyEvent + int(ev.Len)
			if end > len(b) {
				break
			}
			if ev.Mask&unix.IN_Q_OVERFLOW != 0 {
				wakeDir(dir)
			} else if name := b[unix.SizeofInotifyEvent:end]; len(name) > 0 {
				if i := bytes.IndexByte(name, 0); i >= 0 {
					name = name[:i]
				}
				if esc, ok := lockFileEsc(string(name)); ok {
					wake(waitKey(dir, esc))
				}
			}
			b = b[end:]
		}
	}
}

// wakeDir wakes every waiter on dir, for when inotify lost events (its queue
// overflowed).
func wakeDir(dir string) {
	prefix := waitKey(dir, "")
	waits.Lock()
	for k, q := range waits.m {
		if strings.HasPrefix(k, prefix) {
			close(q.ch)
			q.ch = make(chan struct{})
		}
	}
	waits.Unlock()
}
