package filelock

import (
	"encoding/binary"
	"os"

	"golang.org/x/sys/unix"
)

// watcher reports markers removed from a directory by any process.
type watcher interface{ stop() }

type inotify struct {
	f    *os.File
	done chan struct{}
}

// startWatcher watches dir with inotify and calls onName with the escaped
// name of every marker deleted or renamed away, and onLost when events were
// dropped. It returns nil if inotify is unavailable (then waiters poll).
func startWatcher(dir string, onName func(esc string), onLost func()) watcher {
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		return nil
	}
	if _, err := unix.InotifyAddWatch(fd, dir, unix.IN_DELETE|unix.IN_MOVED_FROM|unix.IN_ONLYDIR); err != nil {
		unix.Close(fd)
		return nil
	}
	// A non-blocking fd goes to the runtime poller, so Read parks the
	// goroutine and Close wakes it.
	w := &inotify{f: os.NewFile(uintptr(fd), "inotify:"+dir), done: make(chan struct{})}
	go w.run(onName, onLost)
	return w
}

func (w *inotify) run(onName func(string), onLost func()) {
	defer close(w.done)
	buf := make([]byte, 16*(unix.SizeofInotifyEvent+unix.NAME_MAX+1))
	for {
		n, err := w.f.Read(buf)
		if err != nil {
			return
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			mask := binary.NativeEndian.Uint32(buf[off+4:])
			nameLen := int(binary.NativeEndian.Uint32(buf[off+12:]))
			name := buf[off+unix.SizeofInotifyEvent : min(n, off+unix.SizeofInotifyEvent+nameLen)]
			off += unix.SizeofInotifyEvent + nameLen
			if mask&(unix.IN_Q_OVERFLOW|unix.IN_IGNORED) != 0 {
				onLost()
				continue
			}
			if i := indexNUL(name); i >= 0 {
				name = name[:i]
			}
			if esc, kind := classify(string(name)); kind == kindMarker {
				onName(esc)
			}
		}
	}
}

func indexNUL(b []byte) int {
	for i, c := range b {
		if c == 0 {
			return i
		}
	}
	return -1
}

func (w *inotify) stop() {
	w.f.Close()
	<-w.done
}
