//go:build linux

package flock

import (
	"os"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Waiters in other processes. A waiter learns of a release in another
// process from inotify: the close of the lock file. A release that keeps
// its descriptor for the next Acquire (see idle.go) closes nothing, so it
// must know whether anyone waits: each waiter counts itself in its
// directory's board, the file ubgo-flock.waiters mapped shared by every
// process that uses the directory, in one of 1024 counters chosen by a
// hash of the name. A release unlocks, then reads the counter, and closes
// the descriptor (the event waiters need) unless it is zero.
//
// The order is what makes it safe: a waiter counts itself before it tries
// the lock. If that try failed, the holder's unlock came after it, and the
// kernel's own lock bookkeeping (a spin lock both calls take) orders the
// waiter's increment before the holder's read. A waiter that dies leaves
// its count behind: releases of the names on its counter then close as if
// someone waited, which costs time, not correctness.

const (
	boardFile  = "ubgo-flock.waiters"
	boardSlots = 1024
	boardSize  = 4 * boardSlots
)

var boards = struct {
	sync.Mutex
	m   map[string]*board
	bad map[string]bool // directories whose board could not be mapped
}{m: map[string]*board{}, bad: map[string]bool{}}

// board is one directory's mapped counters, shared by the users of the
// directory in this process and unmapped boardLinger after the last lets
// go, so that waits and releases that come and go do not map it anew
// each time.
type board struct {
	dir   string
	refs  int
	mem   []byte
	unmap *time.Timer // runs boardLinger after refs fell to 0
}

const boardLinger = time.Second

// holdBoard returns dir's board with a reference for the caller, or nil
// when it cannot be mapped (a release then always closes, and a waiter
// falls back on polling).
func holdBoard(dir string) *board {
	boards.Lock()
	defer boards.Unlock()
	if b := boards.m[dir]; b != nil {
		if b.refs++; b.refs == 1 && b.unmap != nil {
			b.unmap.Stop()
		}
		return b
	}
	if boards.bad[dir] {
		return nil // do not try again at every release
	}
	mem, err := mapBoard(dir)
	if err != nil {
		boards.bad[dir] = true
		return nil
	}
	b := &board{dir: dir, refs: 1, mem: mem}
	boards.m[dir] = b
	return b
}

func mapBoard(dir string) ([]byte, error) {
	fd, err := sysOpen(dir+string(os.PathSeparator)+boardFile, true, true)
	if err != nil {
		return nil, err
	}
	defer sysClose(fd)
	// fallocate, not ftruncate: it never zeroes counters another process
	// already uses, and it gives the pages disk blocks, so that touching
	// the mapping cannot fault for want of space.
	for {
		err = unix.Fallocate(fd, 0, 0, boardSize)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		return nil, err
	}
	return unix.Mmap(fd, 0, boardSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
}

// drop gives the caller's reference back.
func (b *board) drop() {
	if b == nil {
		return
	}
	boards.Lock()
	defer boards.Unlock()
	if b.refs--; b.refs > 0 {
		return
	}
	if b.unmap != nil {
		b.unmap.Reset(boardLinger)
		return
	}
	b.unmap = time.AfterFunc(boardLinger, func() {
		boards.Lock()
		defer boards.Unlock()
		if b.refs > 0 || boards.m[b.dir] != b {
			return // taken up again meanwhile
		}
		delete(boards.m, b.dir)
		unix.Munmap(b.mem)
	})
}

// slot is the counter of the name whose escaped form is esc.
func (b *board) slot(esc string) *atomic.Uint32 {
	h := uint32(2166136261) // FNV-1a
	for i := 0; i < len(esc); i++ {
		h = (h ^ uint32(esc[i])) * 16777619
	}
	return (*atomic.Uint32)(unsafe.Pointer(&b.mem[4*(h%boardSlots)]))
}

// othersWait reports whether a release of esc must close its descriptor
// to wake a waiter; b is the directory's board, nil when there is none.
// The caller has unlocked already.
func othersWait(b *board, esc string) (yes bool) {
	if b == nil {
		return true
	}
	defer func() {
		if recover() != nil {
			yes = true
		}
	}()
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	return b.slot(esc).Load() != 0
}

// add adds d to esc's counter; false if the board faulted. The board is a
// file: one truncated by hand turns a touch of its mapping into SIGBUS,
// which would kill the process. SetPanicOnFault makes that a panic,
// recovered here and in othersWait, and the board then counts as
// unusable: waiters poll, releases close.
func (b *board) add(esc string, d uint32) (ok bool) {
	defer func() {
		if recover() != nil {
			ok = false
		}
	}()
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	b.slot(esc).Add(d)
	return true
}

// countWaiter counts a waiter on esc in dir's board until done is called;
// ok is false when there is no board, and the waiter must poll.
func countWaiter(dir, esc string) (done func(), ok bool) {
	b := holdBoard(dir)
	if b == nil {
		return func() {}, false
	}
	if !b.add(esc, 1) {
		b.drop()
		return func() {}, false
	}
	return func() {
		b.add(esc, ^uint32(0))
		b.drop()
	}, true
}
