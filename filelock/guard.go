//go:build unix

package filelock

import (
	"context"
	"fmt"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// A guard is the flock on a name's counter file, <esc>.token, held for the
// few syscalls of one change to the name's markers.
//
// Goroutines of one process first queue for the guard on a channel, in
// order, and only the one at the head polls flock: in-process contenders
// are handed the guard at once instead of racing each other's polling.
type guard struct {
	fd    int
	local *localGuard
}

type guardKey struct{ dir, esc string }

type localGuard struct {
	key  guardKey
	ch   chan struct{} // capacity 1: holding a token is holding the local guard
	refs int           // guarded by localGuards.Mutex
}

var localGuards = struct {
	sync.Mutex
	m map[guardKey]*localGuard
}{m: map[guardKey]*localGuard{}}

func takeLocal(ctx context.Context, k guardKey) (*localGuard, error) {
	localGuards.Lock()
	l := localGuards.m[k]
	if l == nil {
		l = &localGuard{key: k, ch: make(chan struct{}, 1)}
		localGuards.m[k] = l
	}
	l.refs++
	localGuards.Unlock()
	select {
	case l.ch <- struct{}{}:
		return l, nil
	case <-ctx.Done():
		l.unref()
		return nil, ctx.Err()
	}
}

func (l *localGuard) release() {
	<-l.ch
	l.unref()
}

func (l *localGuard) unref() {
	localGuards.Lock()
	defer localGuards.Unlock()
	if l.refs--; l.refs == 0 {
		delete(localGuards.m, l.key)
	}
}

// lockGuard takes the guard of esc in dir, polling flock so that ctx is
// honoured.
func lockGuard(ctx context.Context, dir, esc string) (*guard, error) {
	local, err := takeLocal(ctx, guardKey{dir, esc})
	if err != nil {
		return nil, err
	}
	fd, err := flockGuard(ctx, counterPath(dir, esc), dir)
	if err != nil {
		local.release()
		return nil, err
	}
	return &guard{fd: fd, local: local}, nil
}

func (g *guard) unlock() {
	unix.Close(g.fd) // drops the flock
	g.local.release()
}

func flockGuard(ctx context.Context, path, dir string) (int, error) {
	for {
		fd, err := open(path, unix.O_RDWR|unix.O_CREAT, 0o644)
		if err == unix.ENOENT {
			// The directory was removed under us; bring it back.
			if err := os.MkdirAll(dir, 0o777); err != nil {
				return -1, fmt.Errorf("filelock: lock directory: %w", err)
			}
			fd, err = open(path, unix.O_RDWR|unix.O_CREAT, 0o644)
		}
		if err != nil {
			return -1, fmt.Errorf("filelock: open guard: %w", err)
		}
		if err := flock(ctx, fd); err != nil {
			unix.Close(fd)
			return -1, err
		}
		// A lock on a file that was unlinked and recreated since we opened
		// it excludes nobody: check that the path still names our inode.
		var a, b unix.Stat_t
		if err := unix.Fstat(fd, &a); err != nil {
			unix.Close(fd)
			return -1, fmt.Errorf("filelock: guard: %w", err)
		}
		err = unix.Stat(path, &b)
		if err == nil && a.Ino == b.Ino && a.Dev == b.Dev {
			return fd, nil
		}
		unix.Close(fd)
		if err != nil && err != unix.ENOENT {
			return -1, fmt.Errorf("filelock: guard: %w", err)
		}
	}
}

func flock(ctx context.Context, fd int) error {
	backoff := 20 * time.Microsecond
	for {
		err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB)
		switch err {
		case nil:
			return nil
		case unix.EWOULDBLOCK, unix.EINTR:
		default:
			return fmt.Errorf("filelock: flock guard: %w", err)
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		time.Sleep(backoff)
		backoff = min(2*backoff, 2*time.Millisecond)
	}
}
