package dirwatch

import (
	"bytes"
	"os"
	"strings"
	"syscall"
	"unsafe"
)

// A watch reads one directory's inotify events.
type watch struct {
	f    *os.File
	done chan struct{}
}

// A release closes a file written to (flock) or deletes or renames it away
// (filelock, a sweep).
const events = syscall.IN_CLOSE_WRITE | syscall.IN_DELETE | syscall.IN_MOVED_FROM | syscall.IN_ONLYDIR

// start watches dir, or returns nil when inotify is unavailable (the
// per-user limit of instances, say): waiters then poll.
func start(dir string) *watch {
	fd, err := syscall.InotifyInit1(syscall.IN_NONBLOCK | syscall.IN_CLOEXEC)
	if err != nil {
		return nil
	}
	if _, err := syscall.InotifyAddWatch(fd, dir, events); err != nil {
		syscall.Close(fd)
		return nil
	}
	// A non-blocking descriptor goes to the runtime poller, so Read parks
	// the goroutine and Close wakes it.
	w := &watch{f: os.NewFile(uintptr(fd), "inotify:"+dir), done: make(chan struct{})}
	go w.run(dir)
	return w
}

func (w *watch) run(dir string) {
	defer close(w.done)
	buf := make([]byte, 64<<10)
	for {
		n, err := w.f.Read(buf)
		if err != nil {
			return // closed by stop
		}
		mu.Lock()
		h := hubs[dir]
		for b := buf[:n]; len(b) >= syscall.SizeofInotifyEvent; {
			ev := (*syscall.InotifyEvent)(unsafe.Pointer(&b[0]))
			end := syscall.SizeofInotifyEvent + int(ev.Len)
			if end > len(b) {
				break
			}
			name := b[syscall.SizeofInotifyEvent:end]
			if i := bytes.IndexByte(name, 0); i >= 0 {
				name = name[:i]
			}
			switch {
			case h == nil:
			case ev.Mask&(syscall.IN_Q_OVERFLOW|syscall.IN_IGNORED) != 0:
				h.wake("") // events were lost, or the directory went away
			default:
				if esc := nameOf(string(name)); esc != "" {
					h.wake(esc)
				}
			}
			b = b[end:]
		}
		mu.Unlock()
	}
}

func (w *watch) stop() {
	w.f.Close()
	<-w.done
}

// nameOf returns the escaped name whose lock file is file, or "".
func nameOf(file string) string {
	esc, rest, ok := strings.Cut(file, ".")
	if !ok || esc == "" {
		return ""
	}
	if rest == "lock" {
		return esc
	}
	n, ok := strings.CutSuffix(rest, ".lock")
	if !ok || n == "" || strings.Trim(n, "0123456789") != "" {
		return ""
	}
	return esc
}
