package flock

import (
	"context"
	"sync"
	"time"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/backend"
	"github.com/ubgo/lock/internal/dirwatch"
)

// Holder is one held lock or semaphore permit. It owns its open files;
// the kernel holds the lock for as long as they are open.
type Holder struct {
	f        *Factory
	name     string
	dir, esc string
	path     string // <esc>.lock
	slotPath string // <esc>.<i>.lock of a permit; "" for a mutex
	token    uint64
	since    time.Time
	opts     *lock.Options
	ctx      context.Context // the Acquire context without its cancellation, for reports
	state    *backend.State

	mu     sync.Mutex
	nameFd sysFile
	slotFd sysFile // noFile for a mutex
	closed bool
}

func (c *call) newHolder(nameFd, slotFd sysFile, slotPath string, token uint64, now time.Time) *Holder {
	return &Holder{
		f: c.f, name: c.name, dir: c.dir, esc: c.esc, path: c.namePath, slotPath: slotPath,
		token: token, since: now, opts: c.o, ctx: context.WithoutCancel(c.ctx), state: backend.NewState(),
		nameFd: nameFd, slotFd: slotFd,
	}
}

// Token is the fencing token, strictly increasing per name.
func (h *Holder) Token() uint64 { return h.token }

// Done is closed when the lock is released or lost.
func (h *Holder) Done() <-chan struct{} { return h.state.Done() }

// Err is nil while held or after Release, and matches ErrLockLost once
// lost.
func (h *Holder) Err() error { return h.state.Err() }

// Name is the name the lock was acquired under.
func (h *Holder) Name() string { return h.name }

// Path is the lock file of a mutex, or the slot file of a semaphore
// permit.
func (h *Holder) Path() string {
	if h.slotPath != "" {
		return h.slotPath
	}
	return h.path
}

// Release gives the lock up by closing the holder's files: the kernel
// frees the lock at once, and the close is the event that wakes waiters
// in other processes (inotify, Linux). The files stay for the next holder
// (sweeps remove them). Release is idempotent; after a loss it returns an
// error matching ErrLockLost.
func (h *Holder) Release() error {
	if h.closeFiles(nil) {
		h.f.forget(h)
		dirwatch.Signal(h.dir, h.esc)
		if h.state.End() {
			backend.Report(h.ctx, h.opts, lock.Event{Backend: backendName, Op: lock.OpRelease, Name: h.name, Token: h.token, Held: time.Since(h.since)})
		}
	}
	return h.state.Err()
}

// lose ends h with err, which matches ErrLockLost, by closing its files.
// Whoever closes them first, lose or Release, decides how h ended; lose
// closes Done just before the files, so the holder is told before the
// kernel can give the lock to another.
func (h *Holder) lose(err error) {
	lost := false
	if !h.closeFiles(func() { lost = h.state.Lose(err) }) {
		return // released, or lost already
	}
	h.f.forget(h)
	dirwatch.Signal(h.dir, h.esc)
	if lost {
		backend.Report(h.ctx, h.opts, lock.Event{Backend: backendName, Op: lock.OpLost, Name: h.name, Token: h.token, Held: time.Since(h.since), Err: err})
	}
}

// closeFiles closes the holder's files, and reports whether this call
// did. before, if not nil, runs first, under h.mu.
func (h *Holder) closeFiles(before func()) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return false
	}
	h.closed = true
	if before != nil {
		before()
	}
	if h.slotFd != noFile {
		sysClose(h.slotFd)
	}
	sysClose(h.nameFd)
	return true
}

// inPlace reports whether the holder's files are still the ones at their
// paths. Only clear evidence counts: an error reading them does not.
func (h *Holder) inPlace() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return true
	}
	if same, err := sysSameFile(h.nameFd, h.path); err == nil && !same {
		return false
	}
	if h.slotFd != noFile {
		if same, err := sysSameFile(h.slotFd, h.slotPath); err == nil && !same {
			return false
		}
	}
	return true
}

// admit adds h to the factory's holders, which Close loses and the check
// timer verifies, and bounds it by WithMaxHold; lock.ErrClosed when the
// factory is closed.
func (f *Factory) admit(h *Holder) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return lock.ErrClosed
	}
	f.held[h] = struct{}{}
	if f.check > 0 && f.timer == nil {
		f.timer = time.AfterFunc(f.check, f.verify)
	}
	if h.opts.MaxHold > 0 { // h.lose, as a value, is an allocation
		h.state.Bound(h.opts, ErrLockLost, nil, h.lose)
	}
	return nil
}

// forget drops h from the factory's holders.
func (f *Factory) forget(h *Holder) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.held, h)
}

// verify runs every check interval while the factory holds locks: a
// holder whose file is no longer the one at its path is lost.
func (f *Factory) verify() {
	f.mu.Lock()
	held := make([]*Holder, 0, len(f.held))
	for h := range f.held {
		held = append(held, h)
	}
	f.mu.Unlock()
	for _, h := range held {
		if !h.inPlace() {
			h.lose(backend.Loss(ErrLockLost, lock.ErrRemoved, "the lock file was removed or replaced"))
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.held) > 0 && !f.closed {
		f.timer.Reset(f.check)
	} else {
		f.timer = nil
	}
}
