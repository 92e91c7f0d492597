package flock

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/backend"
)

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

// file is the path of the name's file with suffix. dir is clean
// (resolveDir) and esc has no separator or dot, so filepath.Join's
// cleaning would change nothing.
func (c *call) file(suffix string) string {
	if os.IsPathSeparator(c.dir[len(c.dir)-1]) { // the root
		return c.dir + c.esc + suffix
	}
	return c.dir + string(filepath.Separator) + c.esc + suffix
}

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

// errAgain is what a phase of an attempt returns when it met a passing
// state (a sweep, a file replaced since it was opened, a first member
// writing its limit): the attempt tries once more, opening the path again
// if the phase closed the file.
var errAgain = errors.New("flock: try again")

// An attempt takes a name, or reports ErrLocked and keeps its files open
// for the next try.
type attempt interface {
	try(c *call) (*Holder, error)
	close() // closes the files it still has
}

// newAttempt is the attempt of c's mode: a semaphore's permit, a shared
// holder, or a mutex.
func newAttempt(c *call) attempt {
	switch {
	case c.limit > 1:
		return newSemAttempt(c.limit)
	case c.o.Shared:
		return &sharedAttempt{lockFile: lockFile{fd: noFile}}
	}
	return &mutexAttempt{lockFile: lockFile{fd: noFile}, want: noFile}
}

// lockFile is <esc>.lock as an attempt keeps it open from one try to the
// next.
type lockFile struct {
	fd     sysFile
	reused bool // opened before an earlier, failed try
}

// open opens the name's lock file unless it is open already.
func (l *lockFile) open(c *call) error {
	if l.fd != noFile {
		return nil
	}
	fd, err := c.open(c.namePath)
	if err != nil {
		return err
	}
	l.fd, l.reused = fd, false
	return nil
}

func (l *lockFile) close() {
	if l.fd != noFile {
		sysClose(l.fd)
		l.fd = noFile
	}
}

// moved reports whether a file opened before an earlier try is no longer
// the one at the path.
func (l *lockFile) moved(c *call) (bool, error) {
	if !l.reused {
		return false, nil
	}
	same, err := sysSameFile(l.fd, c.namePath)
	if err != nil {
		return false, fmt.Errorf("flock: %w", err)
	}
	return !same, nil
}

// why reads, without the lock, why the file is busy: errAgain for a
// sweep removing it, a mismatch for semaphore permits, nil for a holder
// (a torn read is invalid and counts as one). The file kept open is
// reused: the try that locks it checks it is still the path's.
func (l *lockFile) why(c *call, spins int) error {
	l.reused = true
	rec, valid, _ := readCounter(l.fd)
	switch {
	case valid && rec.dead && spins < maxDeadSpins:
		return errAgain
	case valid && !rec.dead && rec.limit > 1:
		return c.mismatch(rec.limit)
	}
	return nil
}

// mutexAttempt takes a name with limit 1: an exclusive lock on <esc>.lock.
type mutexAttempt struct {
	lockFile
	want sysFile // <esc>.want, locked exclusively while a writer waits
}

func (m *mutexAttempt) close() {
	m.lockFile.close()
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
		if err := m.open(c); err != nil {
			return nil, err
		}
		ok, err := sysTryLock(m.fd, true)
		if err != nil {
			return nil, fmt.Errorf("flock: %w", err)
		}
		var h *Holder
		if ok {
			h, err = m.stamp(c)
		} else {
			err = m.busy(c, spins)
		}
		if err != errAgain {
			return h, err
		}
	}
}

// busy handles a lock file another holds. A writer that waits then keeps
// new readers out, and looks once more in case the name was freed
// meanwhile.
func (m *mutexAttempt) busy(c *call, spins int) error {
	switch err := m.why(c, spins); {
	case err == errAgain:
		m.close() // a sweeper is removing it: open the path again
		return err
	case err != nil:
		return err
	}
	if c.o.Wait {
		took, err := m.holdWant(c)
		if err != nil {
			m.close()
			return err
		}
		if took && spins < maxDeadSpins {
			return errAgain
		}
	}
	return ErrLocked
}

// stamp finishes a try that locked the file: the next token and the
// holder, written into the record.
func (m *mutexAttempt) stamp(c *call) (*Holder, error) {
	rec, valid, err := readCounter(m.fd)
	if err != nil {
		m.close()
		return nil, fmt.Errorf("flock: reading lock file: %w", err)
	}
	if valid && rec.dead {
		err := c.finishSweep(m.fd)
		m.close()
		return nil, cmp.Or(err, errAgain)
	}
	if moved, err := m.moved(c); err != nil || moved {
		m.close()
		return nil, cmp.Or(err, errAgain)
	}
	if !valid {
		// A new file, or a damaged one: start above every swept name's
		// last token, and above the clock.
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
	lockFile
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
		if err := a.open(c); err != nil {
			return nil, err
		}
		ok, err := c.lockShared(a.fd)
		if err != nil {
			a.close()
			return nil, err
		}
		if !ok {
			// A writer holds it or waits for it (or a sweep, for a moment).
			if err := a.why(c, spins); err != errAgain {
				return nil, cmp.Or(err, ErrLocked)
			}
			a.close()
			continue
		}
		if moved, err := a.moved(c); err != nil || moved {
			a.close()
			if err != nil {
				return nil, err
			}
			continue
		}
		h, limit, err := a.stamp(c)
		if err != errAgain {
			return h, err
		}
		if mismatches++; mismatches > 1 {
			if limit > 1 {
				return nil, c.mismatch(limit)
			}
			return nil, ErrLocked
		}
	}
}

// stamp finishes a try that holds the shared lock: under the guard, the
// next token and the reader, written into the record. errAgain when the
// file was swept or semaphore members hold it (limit is theirs then).
func (a *sharedAttempt) stamp(c *call) (h *Holder, limit int, err error) {
	now := time.Now()
	var token uint64
	err = c.underGuard(func() (err error) {
		token, limit, err = a.write(c, now)
		return err
	})
	if err != nil {
		a.close()
		return nil, limit, err
	}
	h = c.newHolder(a.fd, noFile, "", token, now)
	a.fd = noFile
	return h, 0, nil
}

// write is stamp's work under the guard.
func (a *sharedAttempt) write(c *call, now time.Time) (token uint64, limit int, err error) {
	rec, valid, err := readCounter(a.fd)
	converted := false
	switch {
	case err != nil:
		return 0, 0, fmt.Errorf("flock: reading lock file: %w", err)
	case valid && rec.dead: // swept before we locked it
		return 0, 0, errAgain
	case valid && rec.limit > 1:
		// Semaphore members hold it, or held it last. Alone (the lock
		// converts), a reader may take it over.
		ok, err := sysTryLock(a.fd, true)
		if err != nil {
			return 0, 0, err
		}
		if !ok {
			return 0, rec.limit, errAgain // the conversion dropped our lock
		}
		converted = true
	case !valid:
		// A new file, or a damaged one: start above every swept name's
		// last token.
		if rec.token, err = readFence(c.ctx, c.dir); err != nil {
			return 0, 0, err
		}
	}
	token = backend.NextToken(rec.token, now)
	out := c.holderRecord(token, now)
	out.limit = 1
	if err := writeRecord(a.fd, &out); err != nil {
		return 0, 0, err
	}
	if converted {
		if ok, err := sysDowngrade(a.fd); err != nil || !ok {
			return 0, 0, cmp.Or(err, errAgain) // the kernel let someone in between
		}
	}
	return token, 0, nil
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
	lockFile
	slots      []sysFile
	member     bool // holds the shared lock and checked the limit
	mismatches int  // limits that disagreed, in one join
}

func newSemAttempt(n int) *semAttempt {
	s := &semAttempt{lockFile: lockFile{fd: noFile}, slots: make([]sysFile, n)}
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
	s.lockFile.close()
	s.member = false
}

// errChanged: a record checked under the shared lock changed, which the
// protocol rules out unless someone wrote the file by hand.
var errChanged = errors.New("flock: lock file changed while shared; was it edited by hand?")

// maxJoinSpins bounds the passing states join waits out before it calls
// the name busy.
const maxJoinSpins = 20

// join makes the attempt a member: the name's lock file held shared, with
// the limit checked.
func (s *semAttempt) join(c *call) error {
	s.mismatches = 0
	for spins := 0; spins < maxJoinSpins; spins++ {
		err := s.lockName(c, spins)
		if err == nil {
			err = s.check(c)
		}
		if err != errAgain {
			return err
		}
	}
	return ErrLocked
}

// lockName takes the lock file shared; a first member, finding it free,
// writes the limit first.
func (s *semAttempt) lockName(c *call, spins int) error {
	if err := s.open(c); err != nil {
		return err
	}
	ok, err := sysTryLock(s.fd, true)
	if err != nil {
		return fmt.Errorf("flock: %w", err)
	}
	if ok {
		return s.first(c)
	}
	if ok, err = sysTryLock(s.fd, false); err != nil {
		return fmt.Errorf("flock: %w", err)
	}
	if !ok {
		return s.busy(c, spins)
	}
	return nil
}

// first writes the limit into a lock file nobody holds, keeping the
// counter, and converts the lock to shared.
func (s *semAttempt) first(c *call) error {
	rec, valid, err := readCounter(s.fd)
	if err != nil {
		s.close()
		return fmt.Errorf("flock: reading lock file: %w", err)
	}
	if valid && rec.dead {
		err := c.finishSweep(s.fd)
		s.close()
		return cmp.Or(err, errAgain)
	}
	if !valid {
		if rec.token, err = readFence(c.ctx, c.dir); err != nil {
			s.close()
			return err
		}
	}
	out := record{name: c.name, limit: c.limit, token: rec.token}
	if err := writeRecord(s.fd, &out); err != nil {
		s.close()
		return err
	}
	if ok, err := sysDowngrade(s.fd); err != nil || !ok {
		// The kernel let someone in between: start over.
		s.close()
		if err != nil {
			return fmt.Errorf("flock: %w", err)
		}
		return ErrLocked
	}
	return nil
}

// busy handles an exclusive holder of the lock file: a mutex, or for a
// moment a sweep or a first member writing its limit over an old one.
func (s *semAttempt) busy(c *call, spins int) error {
	s.reused = true
	rec, valid, _ := readCounter(s.fd)
	switch {
	case valid && rec.dead && spins < maxDeadSpins:
		s.close()
		return errAgain
	case valid && !rec.dead && rec.limit != c.limit:
		if spins < maxDeadSpins {
			time.Sleep(50 * time.Microsecond)
			return errAgain
		}
		return c.mismatch(rec.limit)
	}
	return ErrLocked
}

// check reads the record of the shared lock file under the guard, where
// members write it: a group of our limit is joined.
func (s *semAttempt) check(c *call) error {
	var rec record
	var valid bool
	if err := c.underGuard(func() (err error) {
		rec, valid, err = readCounter(s.fd)
		return err
	}); err != nil {
		s.close()
		return err
	}
	switch {
	case valid && rec.dead:
		s.close()
		return errAgain
	case valid && rec.limit == c.limit:
		s.member = true
		return nil
	}
	// Another limit, or no record: maybe the members it belonged to are
	// gone and we joined only a passing shared lock (Inspect). Look once
	// more before calling it a mismatch.
	s.close()
	if s.mismatches++; s.mismatches > 1 {
		if valid {
			return c.mismatch(rec.limit)
		}
		return ErrLocked
	}
	return errAgain
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
				same1, err1 := sysSameFile(s.fd, c.namePath)
				same2, err2 := sysSameFile(s.slots[i], c.slotPath(i))
				if err := errors.Join(err1, err2); err != nil || !same1 || !same2 {
					s.close()
					if err != nil {
						return nil, fmt.Errorf("flock: %w", err)
					}
					break // start over with fresh files
				}
			}
			return s.stamp(c, i)
		}
		if s.member {
			s.reused = true
			return nil, ErrLocked
		}
	}
}

// stamp finishes an attempt that holds slot i: the token, under the guard.
func (s *semAttempt) stamp(c *call, i int) (*Holder, error) {
	now := time.Now()
	var token uint64
	err := c.underGuard(func() error {
		rec, valid, err := readCounter(s.fd)
		if err != nil {
			return fmt.Errorf("flock: reading lock file: %w", err)
		}
		if !valid || rec.dead || rec.limit != c.limit {
			return errChanged
		}
		token = backend.NextToken(rec.token, now)
		return writeRecord(s.fd, &record{name: c.name, limit: c.limit, token: token})
	})
	if err == nil {
		out := c.holderRecord(token, now)
		err = writeRecord(s.slots[i], &out)
	}
	if err != nil {
		s.close()
		return nil, err
	}
	h := c.newHolder(s.fd, s.slots[i], c.slotPath(i), token, now)
	s.fd, s.slots[i] = noFile, noFile
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
