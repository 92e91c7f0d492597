package lock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"
)

// AcquireAll takes every one of names from l, all or nothing, and returns
// them as one Holder.
//
// The names are taken one after the other in one canonical order — sorted
// by bytes, duplicates collapsed (the set {a, b} is the set {b, a, a}) —
// so that two callers asking for overlapping sets never wait for each
// other in a cycle, whatever order they list them in. That holds among
// AcquireAll callers and single-name holders; a caller that already holds
// one of the names and asks AcquireAll for a set that sorts it later can
// still wait for itself. l decides how each name is taken: with WithWait,
// AcquireAll waits for each in turn, all under ctx, which is the one
// deadline of the whole set; without, the first held name ends it with
// ErrLocked. If any name cannot be taken, the ones already taken are
// released before AcquireAll returns (a release the store does not answer
// within 250ms goes on in the background), and the error (naming the name,
// and joined with any release error) matches what l's Acquire returned.
// A member lost while a later name is awaited (its lease not renewed,
// WithMaxHold, broken) ends the wait: the others are released and the
// error names that member and matches its Err. A set AcquireAll returns
// has every member held when it returns.
// An empty set, or an invalid name, is an error before anything is taken.
//
// Backends take the names one Acquire at a time; one that can take a set
// in one round trip may later offer it as a capability AcquireAll uses.
func AcquireAll(ctx context.Context, l Locker, names ...string) (*MultiHolder, error) {
	names = slices.Clone(names)
	slices.Sort(names)
	names = slices.Compact(names)
	if len(names) == 0 {
		return nil, fmt.Errorf("%w: AcquireAll needs at least one name", ErrInvalidName)
	}
	for _, name := range names {
		if err := ValidateName(name); err != nil {
			return nil, fmt.Errorf("lock: AcquireAll %q: %w", name, err)
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	m := &MultiHolder{names: names, holders: make([]Holder, 0, len(names)), done: make(chan struct{}), stop: make(chan struct{})}
	m.lost = cancel // a member lost ends the wait for the next
	for _, name := range names {
		h, err := l.Acquire(ctx, name)
		if err != nil {
			return nil, m.abandon(fmt.Errorf("lock: AcquireAll %q: %w", name, err))
		}
		m.holders = append(m.holders, h)
		go m.watch(name, h)
	}
	if m.firstEnded() >= 0 {
		return nil, m.abandon(nil)
	}
	return m, nil
}

// abandonWait is how long AcquireAll waits for the release of the members
// it took when the set cannot be had: backend.Grace, the bound every
// backend's Acquire keeps past its context's end. A store that does not
// answer (often why the set failed) gets the rest in the background.
const abandonWait = 250 * time.Millisecond

// abandon releases the members taken so far and returns why the set could
// not be had: a member's loss if one ended, else err, the failure of the
// name that could not be taken; joined with the release errors that came
// within abandonWait.
func (m *MultiHolder) abandon(err error) error {
	if i := m.firstEnded(); i >= 0 {
		m.end(memberLost(m.names[i], m.holders[i]))
	}
	released := make(chan error, 1)
	go func() { released <- m.Release() }()
	var relErr error
	select {
	case relErr = <-released:
	case <-time.After(abandonWait):
	}
	if lost := m.Err(); lost != nil {
		err = lost
	}
	return errors.Join(err, relErr)
}

// firstEnded returns the index of the first member that has ended, -1 if
// none. It reads the members' Done, not the watches, which may not have
// run yet.
func (m *MultiHolder) firstEnded() int {
	for i, h := range m.holders {
		select {
		case <-h.Done():
			return i
		default:
		}
	}
	return -1
}

// A MultiHolder is a set of locks taken together by AcquireAll. It is a
// Holder: Done closes when any member is lost (or the set is released),
// and Err then names the member. Member gives each name's own holder, for
// its fencing token.
type MultiHolder struct {
	names   []string // sorted, unique
	holders []Holder // holders[i] holds names[i]
	done    chan struct{}
	stop    chan struct{} // closed by Release: the watches end
	lost    func()        // called when a member ends on its own

	mu        sync.Mutex
	err       error
	ended     bool // Done is closed
	releasing bool // Release began: a member's end is no loss of the set

	once   sync.Once
	relErr error
}

// Member returns the holder of name, or nil if name is not in the set.
func (m *MultiHolder) Member(name string) Holder {
	if i, ok := slices.BinarySearch(m.names, name); ok {
		return m.holders[i]
	}
	return nil
}

// Token is the fencing token of a set of one name: that name's holder's.
// A set of several names has no one token: Token is then 0, which every
// fence refuses, so that a write guarded by one name cannot be fenced by
// another's token by mistake; fence it with Member(name).Token().
func (m *MultiHolder) Token() uint64 {
	if len(m.holders) != 1 {
		return 0
	}
	return m.holders[0].Token()
}

// Done is closed when the set is released or any member is lost.
func (m *MultiHolder) Done() <-chan struct{} { return m.done }

// Err is nil while every member is held and after a clean Release; once a
// member is lost it matches ErrLockLost (and what the member's Err
// matches: the backend's ErrLockLost, ErrMaxHold) and names the member.
// A member released on its own, outside the set's Release, counts as
// lost: the set is no longer whole.
func (m *MultiHolder) Err() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.err
}

// Release releases every member, in the reverse of the order they were
// taken, and returns their errors joined: after a loss it matches
// ErrLockLost. The members still held are freed even when one was lost.
// It is idempotent.
func (m *MultiHolder) Release() error {
	m.once.Do(func() {
		m.mu.Lock()
		m.releasing = true
		m.mu.Unlock()
		close(m.stop)
		var errs []error
		for i, h := range slices.Backward(m.holders) {
			if err := h.Release(); err != nil {
				errs = append(errs, fmt.Errorf("lock: release %q: %w", m.names[i], err))
			}
		}
		m.relErr = errors.Join(errs...)
		// A member lost while its watch was not yet told is a loss too.
		var lost error
		for i, h := range m.holders {
			if h.Err() != nil {
				lost = memberLost(m.names[i], h)
				break
			}
		}
		m.end(lost)
	})
	return m.relErr
}

// watch ends the set when h, the holder of name, ends on its own.
func (m *MultiHolder) watch(name string, h Holder) {
	select {
	case <-h.Done():
	case <-m.stop:
		return
	}
	m.mu.Lock()
	releasing := m.releasing
	m.mu.Unlock()
	if releasing {
		return
	}
	m.end(memberLost(name, h))
	m.lost()
}

// end closes Done, recording err unless the set has ended already.
func (m *MultiHolder) end(err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.ended {
		return
	}
	m.ended, m.err = true, err
	close(m.done)
}

// memberLost says that h, the holder of name, ended outside the set's
// Release.
func memberLost(name string, h Holder) error {
	err := h.Err()
	if err == nil {
		err = fmt.Errorf("%w: released on its own", ErrLockLost)
	}
	return fmt.Errorf("lock: AcquireAll member %q: %w", name, err)
}
