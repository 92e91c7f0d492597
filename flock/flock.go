// Package flock is a lock backend built on the kernel's file locks
// (flock(2) on Unix, LockFileEx on Windows): the simplest correct choice
// when every contender runs on one host.
//
// Each name is a lock file in a directory (WithDir). A holder keeps its own
// open file locked, so two Acquires of a name conflict whether they come
// from two processes or from one; the kernel frees the lock the moment the
// holder's process ends, SIGKILL included. There is no lease to size and
// nothing to renew. Tokens are kept in the lock file and survive restarts;
// files stay until Factory.Sweep (or WithSweepAfter) removes them safely.
//
// The guide describes the files, waiting, loss, the assumptions and the
// failure modes: https://github.com/ubgo/lock/blob/main/docs/guides/flock.md
package flock

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"iter"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/backend"
)

// Errors, matching the root sentinels with errors.Is.
var (
	ErrLocked   = fmt.Errorf("flock: %w", lock.ErrLocked)
	ErrLockLost = fmt.Errorf("flock: %w", lock.ErrLockLost)
)

const backendName = "flock"

// MaxPermits is the largest semaphore flock accepts: an Acquire may open
// one file per permit, and a waiter keeps them open.
const MaxPermits = 1024

// DefaultDir is the directory used without WithDir:
// filepath.Join(os.TempDir(), "ubgo-lock"). Every user of a lock must be
// able to create and open files read-write there; services should pass a
// directory of their own (for example under /run) that /tmp cleaners leave
// alone.
func DefaultDir() string { return filepath.Join(os.TempDir(), "ubgo-lock") }

// Factory acquires locks in a directory. Factories, and processes, that
// use the same directory contend for the same names.
type Factory struct {
	cfg   backend.Config
	check time.Duration // WithCheckInterval
	dir   string        // cfg.Options.Dir resolved, or its error in cfg.Err

	ctx    context.Context // cancelled by Close: ends waits and sweeps
	cancel context.CancelFunc
	wg     sync.WaitGroup // background sweeps

	mu     sync.Mutex
	held   map[*Holder]struct{}
	timer  *time.Timer // verifies held files; nil when none is pending
	closed bool
}

// NewFactory returns a factory whose options are the defaults for every
// call. An invalid option is reported by the first Acquire.
func NewFactory(opts ...Option) *Factory {
	ctx, cancel := context.WithCancel(context.Background())
	f := &Factory{cfg: backend.NewConfig(backendName, opts, checkPermits), ctx: ctx, cancel: cancel, held: map[*Holder]struct{}{}}
	f.check = checkInterval(&f.cfg.Options)
	if f.cfg.Err == nil {
		var err error
		if f.dir, err = resolveDir(f.cfg.Options.Dir); err != nil {
			f.cfg.Fail(err)
		}
	}
	return f
}

// Err returns the error of the factory's options, which every Acquire
// also returns; nil when the factory is usable. Check it at start-up.
func (f *Factory) Err() error { return f.cfg.Err }

// Dir is the directory of the factory's lock files.
func (f *Factory) Dir() string {
	if f.dir == "" {
		dir, _ := resolveDir(f.cfg.Options.Dir)
		return dir
	}
	return f.dir
}

// dirOf is the resolved directory of a call.
func (f *Factory) dirOf(o *lock.Options) (string, error) {
	if o.Dir == f.cfg.Options.Dir && f.dir != "" {
		return f.dir, nil
	}
	dir, err := resolveDir(o.Dir)
	if err != nil {
		return "", fmt.Errorf("flock: %w", err)
	}
	return dir, nil
}

func resolveDir(dir string) (string, error) {
	if dir == "" {
		dir = DefaultDir()
	}
	return filepath.Abs(dir)
}

// Acquire takes name. On contention it returns an error matching ErrLocked
// at once, or with WithWait waits until the lock is free or ctx ends.
func (f *Factory) Acquire(ctx context.Context, name string, opts ...Option) (*Holder, error) {
	start := time.Now()
	o, err := f.cfg.Resolve(name, opts, checkPermits)
	return backend.Take(ctx, backend.Call{Backend: backendName, Name: name, Locked: ErrLocked, Start: start}, &o, err, func(ctx context.Context) (*Holder, time.Duration, error) {
		return f.take(ctx, name, &o)
	})
}

// WithLock runs fn while holding name; see lock.WithLock. The context fn
// gets is cancelled if the lock is lost (the factory is closed, or the
// lock file was deleted behind its back).
func (f *Factory) WithLock(ctx context.Context, name string, fn func(ctx context.Context) error, opts ...Option) error {
	return lock.WithLock(ctx, f.AsLocker(opts...), name, fn)
}

// AsLocker returns the factory as a lock.Locker whose every Acquire uses
// opts. Its holders are *Holder values.
func (f *Factory) AsLocker(opts ...Option) lock.Locker {
	return backend.Locker(&f.cfg, opts, f.Acquire)
}

// Close makes every lock held through the factory lost (its files are
// closed, so the kernel frees them; Err matches ErrLockLost and
// lock.ErrClosed), fails waiting and later Acquires with
// lock.ErrClosed, and waits for a sweep it started to stop.
func (f *Factory) Close() error {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return nil
	}
	f.closed = true
	f.cancel()
	held := make([]*Holder, 0, len(f.held))
	for h := range f.held {
		held = append(held, h)
	}
	if f.timer != nil {
		f.timer.Stop()
	}
	f.mu.Unlock()
	closed := fmt.Errorf("%w: %w", ErrLockLost, lock.ErrClosed)
	for _, h := range held {
		h.lose(closed)
	}
	f.wg.Wait()
	return nil
}

func checkPermits(o *lock.Options) error {
	if o.MaxConcurrent > MaxPermits {
		return fmt.Errorf("flock: %w: WithMaxConcurrent(%d): at most %d", lock.ErrInvalidOption, o.MaxConcurrent, MaxPermits)
	}
	return nil
}

// take makes attempts until one gets the lock, in backend.Wait. The
// attempt keeps its descriptors open from one try to the next, so a
// waiter's retries close no file (see wait.go).
func (f *Factory) take(ctx context.Context, name string, o *lock.Options) (*Holder, time.Duration, error) {
	if err := ctx.Err(); err != nil {
		return nil, 0, err
	}
	if f.ctx.Err() != nil {
		return nil, 0, lock.ErrClosed
	}
	dir, err := f.dirOf(o)
	if err != nil {
		return nil, 0, err
	}
	c := newCall(dir, backend.Escape(name))
	c.f, c.ctx, c.name, c.o, c.limit = f, ctx, name, o, o.Limit()
	f.autoSweep(dir, sweepAfter(o))

	var a attempt = &mutexAttempt{fd: noFile, want: noFile}
	switch {
	case c.limit > 1:
		a = newSemAttempt(c.limit)
	case o.Shared:
		a = &sharedAttempt{fd: noFile}
	}
	defer a.close()
	watched := false
	swept := 0
	w := backend.Waiting{
		Wait: o.Wait, Locked: ErrLocked, Closed: f.ctx.Done(),
		MinPoll: minPoll, MaxPoll: maxPoll,
		Subscribe: func() (backend.Subscription, error) {
			s := subscribe(dir, c.esc)
			watched = s.Watched()
			return s, nil
		},
	}
	return backend.Wait(ctx, w, func() (*Holder, time.Duration, error) {
		h, err := a.try(c)
		// A sweep holds names' files for moments: a name it held is not
		// busy (see Factory.Sweep). A waiter is woken when it lets go.
		for errors.Is(err, ErrLocked) && !o.Wait && swept < sweepRetries && afterSweep(ctx, dir) {
			swept++
			h, err = a.try(c)
		}
		switch {
		case err == nil && !f.track(h):
			h.closeFiles(nil)
			return nil, 0, lock.ErrClosed
		case errors.Is(err, ErrLocked) && !watched:
			// No inotify: polls are how releases in other processes show.
			return nil, blindPoll, err
		}
		return h, 0, err
	})
}

// call is one resolved Acquire, or the name a sweep or Inspect works on.
type call struct {
	f        *Factory
	ctx      context.Context
	name     string
	o        *lock.Options
	limit    int
	dir, esc string
	namePath string // <esc>.lock
}

func newCall(dir, esc string) *call {
	c := &call{dir: dir, esc: esc}
	c.namePath = c.file(".lock")
	return c
}

func (c *call) file(suffix string) string { return filepath.Join(c.dir, c.esc+suffix) }

func (c *call) slotPath(i int) string { return c.file("." + strconv.Itoa(i) + ".lock") }

// wantPath is <esc>.want, which a waiting writer locks to keep new readers
// out (WithShared).
func (c *call) wantPath() string { return c.file(".want") }

// open opens (creating) a file of the call's name, creating the directory
// when it is missing.
func (c *call) open(path string) (sysFile, error) { return c.openFile(path, true) }

// openWant opens (creating) the want file, read-only: it is only ever
// locked, and closing a read-only file is no close-after-write event, so
// the tries of readers and writers wake no waiter (see wait.go).
func (c *call) openWant() (sysFile, error) { return c.openFile(c.wantPath(), false) }

func (c *call) openFile(path string, write bool) (sysFile, error) {
	for i := 0; ; i++ {
		fd, err := sysOpen(path, write, true)
		switch {
		case err == nil:
			return fd, nil
		case i == 0 && errors.Is(err, fs.ErrNotExist):
			if err := os.MkdirAll(c.dir, 0o755); err != nil {
				return noFile, fmt.Errorf("flock: %w", err)
			}
			continue
		case i < 100 && sysRetryOpen(err):
			time.Sleep(time.Millisecond)
			continue
		}
		return noFile, fmt.Errorf("flock: %w", err)
	}
}

func (c *call) mismatch(have int) error {
	return fmt.Errorf("flock: %w: %q is held with limit %d, caller asked for %d", lock.ErrLimitMismatch, c.name, have, c.limit)
}

// pid is read once: Go processes do not fork without exec.
var pid = os.Getpid()

var hostname = sync.OnceValue(func() string {
	h, _ := os.Hostname()
	return h
})

func (c *call) holderRecord(token uint64, now time.Time) record {
	return record{name: c.name, token: token, pid: pid, host: hostname(), since: now, owner: c.o.Owner, meta: c.o.Metadata}
}

// finishSweep completes a sweep whose sweeper died between marking the
// file dead and unlinking it: the caller holds fd's exclusive lock. If the
// dead file cannot be removed the name cannot be used, and says why.
func (c *call) finishSweep(fd sysFile) error {
	same, err := sysSameFile(fd, c.namePath)
	if err == nil && same {
		err = sysRemove(c.namePath)
	}
	if err != nil {
		return fmt.Errorf("flock: %s was marked dead by a sweep that did not finish, and removing it failed: %w", c.namePath, err)
	}
	return nil
}

// maxDeadSpins bounds how often an attempt reopens a file marked dead
// before it counts as busy: a sweeper holds a dead file only for moments.
const maxDeadSpins = 3

// An attempt takes a name, or reports ErrLocked and keeps its files open
// for the next try.
type attempt interface {
	try(c *call) (*Holder, error)
	close() // closes the files it still has
}

// mutexAttempt takes a name with limit 1: an exclusive lock on <esc>.lock.
type mutexAttempt struct {
	fd     sysFile
	reused bool    // fd was opened before an earlier, failed try
	want   sysFile // <esc>.want, locked exclusively while a writer waits
}

func (m *mutexAttempt) close() {
	if m.fd != noFile {
		sysClose(m.fd)
		m.fd = noFile
	}
	m.dropWant()
}

func (m *mutexAttempt) dropWant() {
	if m.want != noFile {
		sysClose(m.want)
		m.want = noFile
	}
}

// holdWant takes, for a writer that waits, the exclusive lock of
// <esc>.want that keeps new readers out (see sharedAttempt), and keeps it
// until the writer holds the name or gives up. It reports whether it took
// it just now. A want file swept away since is taken again at the path;
// one that another writer holds, or a reader for a moment, is tried again
// at the next attempt. The kernel frees it when the writer dies.
func (m *mutexAttempt) holdWant(c *call) (bool, error) {
	if m.want != noFile {
		if same, err := sysSameFile(m.want, c.wantPath()); err != nil || same {
			return false, err
		}
		m.dropWant()
	}
	fd, err := c.openWant()
	if err != nil {
		return false, err
	}
	if ok, err := sysTryLock(fd, true); err != nil || !ok {
		sysClose(fd)
		if err != nil {
			return false, fmt.Errorf("flock: %w", err)
		}
		return false, nil
	}
	m.want = fd
	return true, nil
}

func (m *mutexAttempt) try(c *call) (*Holder, error) {
	for spins := 0; ; spins++ {
		if m.fd == noFile {
			fd, err := c.open(c.namePath)
			if err != nil {
				return nil, err
			}
			m.fd, m.reused = fd, false
		}
		ok, err := sysTryLock(m.fd, true)
		if err != nil {
			return nil, fmt.Errorf("flock: %w", err)
		}
		if !ok {
			m.reused = true
			// Read without the lock only to say why: a torn read is
			// invalid and counts as plain contention.
			rec, valid, _ := readRecord(m.fd)
			switch {
			case valid && rec.dead && spins < maxDeadSpins:
				m.close() // a sweeper is removing it: open the path again
				continue
			case valid && !rec.dead && rec.limit > 1:
				return nil, c.mismatch(rec.limit) // semaphore permits hold it
			}
			if c.o.Wait {
				// A writer that waits keeps new readers out, and tries
				// once more in case the name was freed meanwhile.
				took, err := m.holdWant(c)
				if err != nil {
					m.close()
					return nil, err
				}
				if took && spins < maxDeadSpins {
					continue
				}
			}
			return nil, ErrLocked
		}
		rec, valid, err := readRecord(m.fd)
		if err != nil {
			m.close()
			return nil, fmt.Errorf("flock: reading lock file: %w", err)
		}
		if valid && rec.dead {
			err := c.finishSweep(m.fd)
			m.close()
			if err != nil {
				return nil, err
			}
			continue
		}
		if m.reused {
			// Opened before an earlier try: make sure it is still the
			// file at the path.
			if same, err := sysSameFile(m.fd, c.namePath); err != nil || !same {
				m.close()
				if err != nil {
					return nil, fmt.Errorf("flock: %w", err)
				}
				continue
			}
		}
		if !valid {
			// A new file, or a damaged one: start above every swept
			// name's last token, and above the clock.
			if rec.token, err = readFence(c.ctx, c.dir); err != nil {
				m.close()
				return nil, err
			}
		}
		now := time.Now()
		token := backend.NextToken(rec.token, now)
		out := c.holderRecord(token, now)
		out.limit = 1
		if err := writeRecord(m.fd, &out); err != nil {
			m.close()
			return nil, err
		}
		h := c.newHolder(m.fd, noFile, "", token, now)
		m.fd = noFile
		m.dropWant() // readers that come now wait for h
		return h, nil
	}
}

// sharedAttempt takes a name in shared mode (WithShared): a shared lock on
// <esc>.lock, which every reader takes while it holds a shared lock of
// <esc>.want for a moment. A writer that waits holds <esc>.want
// exclusively (mutexAttempt.holdWant), so a reader that comes meanwhile
// finds it busy and waits behind the writer: flock(2) alone would let a
// stream of readers starve the writer. Both locks are the kernel's, so a
// process killed at any step leaves neither behind.
//
// Readers write the name's record — its token counter, with the latest
// reader as holder — under the guard, as semaphore members do.
type sharedAttempt struct {
	fd     sysFile
	reused bool
}

func (a *sharedAttempt) close() {
	if a.fd != noFile {
		sysClose(a.fd)
		a.fd = noFile
	}
}

// lockShared takes fd's shared lock if no writer waits.
func (c *call) lockShared(fd sysFile) (bool, error) {
	want, err := c.openWant()
	if err != nil {
		return false, err
	}
	defer sysClose(want)
	if ok, err := sysTryLock(want, false); err != nil || !ok {
		if err != nil {
			return false, fmt.Errorf("flock: %w", err)
		}
		return false, nil
	}
	ok, err := sysTryLock(fd, false)
	if err != nil {
		return false, fmt.Errorf("flock: %w", err)
	}
	return ok, nil
}

func (a *sharedAttempt) try(c *call) (*Holder, error) {
	for spins, mismatches := 0, 0; ; spins++ {
		if a.fd == noFile {
			fd, err := c.open(c.namePath)
			if err != nil {
				return nil, err
			}
			a.fd, a.reused = fd, false
		}
		ok, err := c.lockShared(a.fd)
		if err != nil {
			a.close()
			return nil, err
		}
		if !ok {
			// A writer holds it or waits for it (or a sweep, for a moment).
			a.reused = true
			rec, valid, _ := readRecord(a.fd)
			switch {
			case valid && rec.dead && spins < maxDeadSpins:
				a.close()
				continue
			case valid && !rec.dead && rec.limit > 1:
				return nil, c.mismatch(rec.limit)
			}
			return nil, ErrLocked
		}
		if a.reused {
			if same, err := sysSameFile(a.fd, c.namePath); err != nil || !same {
				a.close()
				if err != nil {
					return nil, fmt.Errorf("flock: %w", err)
				}
				continue
			}
		}
		now := time.Now()
		var token uint64
		var again, converted bool
		limit := 0 // a semaphore's, which holds the name
		err = c.underGuard(func() error {
			rec, valid, err := readRecord(a.fd)
			switch {
			case err != nil:
				return fmt.Errorf("flock: reading lock file: %w", err)
			case valid && rec.dead: // swept before we locked it
				again = true
				return nil
			case valid && rec.limit > 1:
				// Semaphore members hold it, or held it last. Alone (the
				// lock converts), a reader may take it over.
				ok, err := sysTryLock(a.fd, true)
				if err != nil || !ok {
					again, limit = true, rec.limit // the conversion dropped our lock
					return err
				}
				converted = true
			case !valid:
				// A new file, or a damaged one: start above every swept
				// name's last token.
				if rec.token, err = readFence(c.ctx, c.dir); err != nil {
					return err
				}
			}
			token = backend.NextToken(rec.token, now)
			out := c.holderRecord(token, now)
			out.limit = 1
			if err := writeRecord(a.fd, &out); err != nil {
				return err
			}
			if converted {
				if ok, err := sysDowngrade(a.fd); err != nil || !ok {
					again = true // the kernel let someone in between
					return err
				}
			}
			return nil
		})
		if err != nil {
			a.close()
			return nil, err
		}
		if again {
			a.close()
			if mismatches++; mismatches > 1 {
				if limit > 1 {
					return nil, c.mismatch(limit)
				}
				return nil, ErrLocked
			}
			continue
		}
		h := c.newHolder(a.fd, noFile, "", token, now)
		a.fd = noFile
		return h, nil
	}
}

// semAttempt takes one permit of a semaphore of n: a shared lock on
// <esc>.lock, which makes it a member of the group whose limit the file
// records, and an exclusive lock on one slot file <esc>.<i>.lock.
//
// The limit is written only under the exclusive lock (by the first member,
// when nobody holds the name) and checked by each member under its shared
// lock, so all members that hold at once agree on it. The token counter in
// the same file is read and written by members under a short exclusive
// lock on <esc>.guard.
type semAttempt struct {
	name   sysFile
	slots  []sysFile
	member bool // holds the shared lock and checked the limit
	reused bool
}

func newSemAttempt(n int) *semAttempt {
	s := &semAttempt{name: noFile, slots: make([]sysFile, n)}
	for i := range s.slots {
		s.slots[i] = noFile
	}
	return s
}

func (s *semAttempt) close() {
	for i, fd := range s.slots {
		if fd != noFile {
			sysClose(fd)
			s.slots[i] = noFile
		}
	}
	if s.name != noFile {
		sysClose(s.name)
		s.name = noFile
	}
	s.member = false
}

// errChanged: a record checked under the shared lock changed, which the
// protocol rules out unless someone wrote the file by hand.
var errChanged = errors.New("flock: lock file changed while shared; was it edited by hand?")

// maxJoinSpins bounds the passing states join waits out before it calls
// the name busy.
const maxJoinSpins = 20

func (s *semAttempt) join(c *call) error {
	mismatches := 0
	for spins := 0; ; spins++ {
		if spins >= maxJoinSpins {
			return ErrLocked
		}
		if s.name == noFile {
			fd, err := c.open(c.namePath)
			if err != nil {
				return err
			}
			s.name, s.reused = fd, false
		}
		ok, err := sysTryLock(s.name, true)
		if err != nil {
			return fmt.Errorf("flock: %w", err)
		}
		if ok {
			// Nobody holds the name: record our limit, keep the counter.
			rec, valid, err := readRecord(s.name)
			if err != nil {
				s.close()
				return fmt.Errorf("flock: reading lock file: %w", err)
			}
			if valid && rec.dead {
				err := c.finishSweep(s.name)
				s.close()
				if err != nil {
					return err
				}
				continue
			}
			if !valid {
				if rec.token, err = readFence(c.ctx, c.dir); err != nil {
					s.close()
					return err
				}
			}
			out := record{name: c.name, limit: c.limit, token: rec.token}
			if err := writeRecord(s.name, &out); err != nil {
				s.close()
				return err
			}
			if ok, err := sysDowngrade(s.name); err != nil || !ok {
				// The kernel let someone in between: start over.
				s.close()
				if err != nil {
					return fmt.Errorf("flock: %w", err)
				}
				return ErrLocked
			}
		} else if ok, err := sysTryLock(s.name, false); err != nil {
			return fmt.Errorf("flock: %w", err)
		} else if !ok {
			// An exclusive holder: a mutex, or for a moment a sweep or
			// a first member writing its limit over an old one.
			s.reused = true
			rec, valid, _ := readRecord(s.name)
			switch {
			case valid && rec.dead && spins < maxDeadSpins:
				s.close()
				continue
			case valid && !rec.dead && rec.limit != c.limit:
				if spins < maxDeadSpins {
					time.Sleep(50 * time.Microsecond)
					continue
				}
				return c.mismatch(rec.limit)
			}
			return ErrLocked
		}
		// Shared. Members write the record under the guard, so read it
		// there too.
		var rec record
		var valid bool
		if err := c.underGuard(func() (err error) {
			rec, valid, err = readRecord(s.name)
			return err
		}); err != nil {
			s.close()
			return err
		}
		switch {
		case valid && rec.dead:
			s.close()
			continue
		case valid && rec.limit == c.limit:
			s.member = true
			return nil
		}
		// Another limit, or no record: maybe the members it belonged to
		// are gone and we joined only a passing shared lock (Inspect).
		// Look once more before calling it a mismatch.
		s.close()
		if mismatches++; mismatches > 1 {
			if valid {
				return c.mismatch(rec.limit)
			}
			return ErrLocked
		}
	}
}

func (s *semAttempt) try(c *call) (*Holder, error) {
	for {
		if !s.member {
			if err := s.join(c); err != nil {
				return nil, err
			}
		}
		for i := range s.slots {
			if s.slots[i] == noFile {
				fd, err := c.open(c.slotPath(i))
				if err != nil {
					return nil, err
				}
				s.slots[i] = fd
			}
			ok, err := sysTryLock(s.slots[i], true)
			if err != nil {
				return nil, fmt.Errorf("flock: %w", err)
			}
			if !ok {
				continue
			}
			if s.reused {
				same1, err1 := sysSameFile(s.name, c.namePath)
				same2, err2 := sysSameFile(s.slots[i], c.slotPath(i))
				if err := errors.Join(err1, err2); err != nil || !same1 || !same2 {
					s.close()
					if err != nil {
						return nil, fmt.Errorf("flock: %w", err)
					}
					break // start over with fresh files
				}
			}
			return s.take(c, i)
		}
		if s.member {
			s.reused = true
			return nil, ErrLocked
		}
	}
}

// take finishes an attempt that holds slot i: the token, under the guard.
func (s *semAttempt) take(c *call, i int) (*Holder, error) {
	now := time.Now()
	var token uint64
	err := c.underGuard(func() error {
		rec, valid, err := readRecord(s.name)
		if err != nil {
			return fmt.Errorf("flock: reading lock file: %w", err)
		}
		if !valid || rec.dead || rec.limit != c.limit {
			return errChanged
		}
		token = backend.NextToken(rec.token, now)
		return writeRecord(s.name, &record{name: c.name, limit: c.limit, token: token})
	})
	if err == nil {
		out := c.holderRecord(token, now)
		err = writeRecord(s.slots[i], &out)
	}
	if err != nil {
		s.close()
		return nil, err
	}
	h := c.newHolder(s.name, s.slots[i], c.slotPath(i), token, now)
	s.name, s.slots[i] = noFile, noFile
	s.close()
	return h, nil
}

// underGuard runs fn holding the exclusive lock of <esc>.guard. The guard
// is held for a read and a write, so it is polled rather than waited for
// with a blocking flock, which could not give up when ctx ends.
func (c *call) underGuard(fn func() error) error {
	fd, err := c.open(c.file(".guard"))
	if err != nil {
		return err
	}
	defer sysClose(fd)
	if err := lockSpin(c.ctx, fd, true); err != nil {
		return err
	}
	return fn()
}

// lockSpin takes a lock that is only ever held for moments (a guard, the
// fence file), polling so that it can give up when ctx ends.
func lockSpin(ctx context.Context, fd sysFile, exclusive bool) error {
	for d := 20 * time.Microsecond; ; d = min(2*d, 5*time.Millisecond) {
		ok, err := sysTryLock(fd, exclusive)
		if err != nil {
			return fmt.Errorf("flock: %w", err)
		}
		if ok {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		time.Sleep(d)
	}
}

// Inspect reports who holds name, from the lock files: the holder's
// token, owner (WithOwner, or pid@host), start time and metadata. It
// takes shared locks for a moment to tell a held file from a free one, so
// an Acquire that does not wait may fail with ErrLocked while it looks.
func (f *Factory) Inspect(ctx context.Context, name string) (lock.Info, error) {
	if err := lock.ValidateName(name); err != nil {
		return lock.Info{}, err
	}
	if f.cfg.Err != nil {
		return lock.Info{}, f.cfg.Err
	}
	dir, err := f.dirOf(&f.cfg.Options)
	if err != nil {
		return lock.Info{}, err
	}
	return inspectFile(ctx, dir, backend.Escape(name), name)
}

// inspectFile reads the holders of the name whose escaped form is esc;
// name is "" when the caller knows only esc (List), and the record's
// name is reported.
func inspectFile(ctx context.Context, dir, esc, name string) (lock.Info, error) {
	c := newCall(dir, esc)
	c.name = name
	for i := 0; ; i++ {
		info, again, err := c.inspect()
		if !again || i >= 20 {
			return info, err
		}
		select {
		case <-ctx.Done():
			return info, ctx.Err()
		case <-time.After(time.Millisecond):
		}
	}
}

// List yields the held names in the factory's directory that start with
// prefix, with their holders as Inspect reports them (and its brief
// shared locks). The order is the directory's, not sorted: the directory
// is read lock.ListPageSize entries at a time, and sorting would need
// every entry at once. A name comes from its lock file's record; a record
// written before List existed has none, and a long (hashed) name among
// those is listed under its escaped file name (backend.ListedName).
// Waiting is 0: waiters are not recorded.
func (f *Factory) List(ctx context.Context, prefix string) iter.Seq2[lock.Info, error] {
	dir := func() (string, error) {
		if f.cfg.Err != nil {
			return "", f.cfg.Err
		}
		return f.dirOf(&f.cfg.Options)
	}
	// A name file is <esc>.lock; esc has no '.', slot files do.
	nameFile := func(file string) (string, bool) {
		esc, ok := strings.CutSuffix(file, ".lock")
		return esc, ok && esc != "" && !strings.Contains(esc, ".")
	}
	return backend.ListDir(ctx, backendName, prefix, dir, nameFile, func(dir, esc string) (lock.Info, error) {
		return inspectFile(ctx, dir, esc, "")
	})
}

// inspect looks once; again means it met a passing state (a sweep, a
// first member writing the limit) and should look again.
func (c *call) inspect() (info lock.Info, again bool, err error) {
	info.Name = c.name
	// Read-only, so closing it wakes no waiter.
	fd, err := sysOpen(c.namePath, false, false)
	if errors.Is(err, fs.ErrNotExist) {
		return info, false, nil
	}
	if err != nil {
		return info, false, fmt.Errorf("flock: %w", err)
	}
	defer sysClose(fd)
	shared, err := sysTryLock(fd, false)
	if err != nil {
		return info, false, fmt.Errorf("flock: %w", err)
	}
	rec, valid, err := readRecord(fd)
	if err != nil {
		return info, false, fmt.Errorf("flock: %w", err)
	}
	if info.Name == "" && valid { // listing a name known only by its file
		info.Name = rec.name
	}
	if !shared { // an exclusive holder: a mutex, or a moment of a sweep or a first member
		if !valid || rec.dead || rec.limit != 1 {
			return info, true, nil
		}
		info.Limit = 1
		info.Holders = []lock.HolderInfo{holderInfo(rec)}
		return info, false, nil
	}
	if !valid {
		// Free and never written, or caught while a member wrote it.
		return info, fileHasData(fd), nil
	}
	if !rec.dead && rec.limit <= 1 && rec.pid != 0 {
		// Free, or held shared (WithShared): readers keep the exclusive
		// lock out. The latest reader's record stands for them.
		if free, err := sysTryLock(fd, true); err != nil || free {
			return info, false, err
		}
		info.Limit = 1
		info.Holders = []lock.HolderInfo{holderInfo(rec)}
		return info, false, nil
	}
	if rec.dead || rec.limit <= 1 {
		return info, false, nil
	}
	for i := 0; i < rec.limit && i < MaxPermits; i++ {
		sfd, err := sysOpen(c.slotPath(i), false, false)
		if err != nil {
			continue
		}
		if free, err := sysTryLock(sfd, false); err == nil && !free {
			if srec, ok, _ := readRecord(sfd); ok {
				info.Holders = append(info.Holders, holderInfo(srec))
			}
		}
		sysClose(sfd)
	}
	if len(info.Holders) > 0 {
		info.Limit = rec.limit
		sort.Slice(info.Holders, func(i, j int) bool { return info.Holders[i].Token < info.Holders[j].Token })
	}
	return info, false, nil
}

func fileHasData(fd sysFile) bool {
	var b [1]byte
	n, _ := sysPread(fd, b[:], 0)
	return n > 0
}

func holderInfo(r record) lock.HolderInfo {
	hi := lock.HolderInfo{Token: r.token, Owner: r.owner, Metadata: r.meta, Since: r.since}
	if r.pid != 0 {
		hi.ID = strconv.Itoa(r.pid) + "@" + r.host
	}
	return hi
}

// Lock is the single-name form: flock.New(name, opts...).Acquire(ctx).
type Lock struct {
	f    *Factory
	name string
}

// New returns the lock for name with opts as its defaults. A bad name or
// option is reported by Acquire.
func New(name string, opts ...Option) *Lock { return &Lock{f: NewFactory(opts...), name: name} }

// Name is the lock's name.
func (l *Lock) Name() string { return l.name }

// Acquire takes the lock; see Factory.Acquire.
func (l *Lock) Acquire(ctx context.Context, opts ...Option) (*Holder, error) {
	return l.f.Acquire(ctx, l.name, opts...)
}

// WithLock runs fn while holding the lock; see Factory.WithLock.
func (l *Lock) WithLock(ctx context.Context, fn func(ctx context.Context) error, opts ...Option) error {
	return l.f.WithLock(ctx, l.name, fn, opts...)
}

// Inspect reports who holds the lock; see Factory.Inspect.
func (l *Lock) Inspect(ctx context.Context) (lock.Info, error) { return l.f.Inspect(ctx, l.name) }

// Close makes a held lock lost and fails later Acquires; see
// Factory.Close. A Lock that is released and dropped needs no Close.
func (l *Lock) Close() error { return l.f.Close() }
