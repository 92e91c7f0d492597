//go:build unix

package filelock

import (
	"context"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/backend"
)

// call is one resolved Acquire.
type call struct {
	f        *Factory
	ctx      context.Context
	name     string
	dir, esc string
	o        *lock.Options
	limit    int
	ttl      time.Duration
	renew    bool
}

func (c *call) mismatch(held int) error {
	return fmt.Errorf("filelock: %w: %q is held with limit %d, caller asked for %d", lock.ErrLimitMismatch, c.name, held, c.limit)
}

// An attempt takes a name in one mode — a mutex, a shared holder, a
// semaphore's permit — one try at a time, under the name's guard
// (call.try).
type attempt interface {
	// pick finds the free marker to write and its slot (-1: <esc>.lock),
	// or returns ErrLocked.
	pick(l *look) (path string, slot int, err error)
	// taken runs under the guard once the attempt's marker is published.
	taken(l *look)
	// giveUp removes what the attempt kept between tries, when the
	// Acquire fails.
	giveUp(c *call)
}

func newAttempt(c *call) attempt {
	switch {
	case c.limit > 1:
		return semAttempt{}
	case c.o.Shared:
		return sharedAttempt{}
	case c.o.Wait:
		return &mutexAttempt{want: &want{}} // a writer that waits keeps new readers out
	}
	return &mutexAttempt{}
}

// look is one try's view of the name, under its guard.
type look struct {
	*call
	g       *guard
	ctr     counter
	j       *judge
	readers int       // reader slots the counter records once the try is done
	retryAt time.Time // when the earliest live marker's lease ends, or our intent is due
	marker  *os.File  // the new marker, written but not yet synced
	raised  bool      // the counter's readers went up: sync it too
}

// try makes one attempt under the name's guard: the limit checked, the
// attempt's pick, the marker published. On contention it returns
// ErrLocked and, when known, l.retryAt. Once the guard is let go,
// published runs (the waiter's turn in its process ends: the next may
// look, and readers get in together), then the new marker (and a raised
// reader count) is synced and the holder admitted: the guard is held for
// a few metadata calls, not for the disk, so readers' syncs overlap and
// waiters' looks need not wait for them.
func (c *call) try(a attempt, published func()) (*Holder, time.Time, error) {
	g, err := lockGuard(c.ctx, c.dir, c.esc)
	if err != nil {
		return nil, time.Time{}, err
	}
	l := &look{call: c, g: g, ctr: readCounter(g.fd)}
	h, err := l.take(a)
	g.unlock()
	if err != nil {
		return nil, l.retryAt, err
	}
	published()
	if err := l.sync(h); err != nil {
		return nil, time.Time{}, h.discard(c.ctx, err)
	}
	if err := c.f.admit(h); err != nil {
		return nil, time.Time{}, h.discard(c.ctx, err)
	}
	return h, time.Time{}, nil
}

// take is try's work under the guard.
func (l *look) take(a attempt) (*Holder, error) {
	l.j = &judge{log: backend.Log(l.o), name: l.name, ttl: l.ttl, now: time.Now()}
	if err := l.checkLimit(); err != nil {
		return nil, err
	}
	path, slot, err := a.pick(l)
	if err != nil {
		return nil, err
	}
	h, err := l.publish(path, slot)
	if err != nil {
		return nil, err
	}
	a.taken(l)
	return h, nil
}

// sync makes the new marker durable, and the counter if the try raised
// its reader count, before the holder is handed out.
func (l *look) sync(h *Holder) error {
	err := syncFile(h.path, l.marker)
	if cerr := l.marker.Close(); err == nil {
		err = cerr
	}
	if err == nil && l.raised {
		err = syncCounter(l.dir, l.esc)
	}
	if err != nil {
		return fmt.Errorf("filelock: sync marker: %w", err)
	}
	return nil
}

// checkLimit refuses a limit other than the one live markers were taken
// under. A stored limit that differs matters only while a permit under
// it is held; if none is, the new limit replaces it.
func (l *look) checkLimit() error {
	l.readers = l.ctr.readers
	switch {
	case l.ctr.limit == 0:
		return l.checkMarkers()
	case l.ctr.limit != l.limit:
		for _, p := range heldPaths(l.dir, l.esc, l.ctr) {
			_, live, _, err := l.j.examine(p)
			if err != nil {
				return err
			}
			if live {
				return l.mismatch(l.ctr.limit)
			}
		}
		l.readers = 0
	}
	return nil
}

// checkMarkers checks the limit without a usable counter: every marker of
// the name, in whatever layout and slot, says the limit it was taken
// under; slot markers taken with limit 1 are shared holders'.
func (l *look) checkMarkers() error {
	paths, err := markerFiles(l.dir, l.esc)
	if err != nil {
		return err
	}
	for _, p := range paths {
		m, live, _, err := l.j.examine(p)
		if err != nil {
			return err
		}
		if live && m != nil && m.Limit != l.limit {
			return l.mismatch(m.Limit)
		}
		l.readers = max(l.readers, slotOf(p)+1)
	}
	return nil
}

// soonest makes t the retry time if it comes first.
func (l *look) soonest(t time.Time) {
	if !t.IsZero() && (l.retryAt.IsZero() || t.Before(l.retryAt)) {
		l.retryAt = t
	}
}

// publish writes the next token to the counter and the new holder's
// marker, whole, at path: a temporary file, then link(2), which fails if a
// file is there. The marker is synced once the guard is let go (try).
func (l *look) publish(path string, slot int) (*Holder, error) {
	h := l.newHolder(path, slot, nextToken(l.ctr, l.j.seen))
	data := h.m.encode()
	if len(data) > maxMarker {
		return nil, fmt.Errorf("filelock: %w: owner and metadata make a marker of %d bytes, over %d", lock.ErrInvalidOption, len(data), maxMarker)
	}
	l.raised = l.o.Shared && slot+1 > l.ctr.readers // see counter.readers
	if err := putCounter(l.g.fd, h.token, l.limit, l.readers); err != nil {
		return nil, fmt.Errorf("filelock: write counter: %w", err)
	}
	tmp := tempPath(l.dir, l.esc, newNonce()[:16])
	f, err := createTemp(tmp, data)
	if err != nil {
		return nil, fmt.Errorf("filelock: write marker: %w", err)
	}
	err = unix.Link(tmp, path)
	unix.Unlink(tmp)
	if err != nil {
		f.Close()
		if err == unix.EEXIST {
			// Only a writer that ignores the guard can get here.
			return nil, ErrLocked
		}
		return nil, fmt.Errorf("filelock: publish marker: %w", err)
	}
	l.marker = f
	return h, nil
}

// noIntent is the part of an attempt that keeps nothing between tries.
type noIntent struct{}

func (noIntent) taken(*look)  {}
func (noIntent) giveUp(*call) {}

// mutexAttempt takes a name exclusively: the marker <esc>.lock, once no
// reader slot holds a live marker either.
type mutexAttempt struct {
	want *want // the intent of a writer that waits; nil for one that does not
}

func (a *mutexAttempt) pick(l *look) (string, int, error) {
	_, live, expires, err := l.j.examine(mutexPath(l.dir, l.esc))
	if err != nil {
		return "", -1, err
	}
	if live {
		return "", -1, a.held(l, expires, false)
	}
	for _, p := range slotPaths(l.dir, l.esc, l.readers) {
		_, live, expires, err := l.j.examine(p)
		if err != nil {
			return "", -1, err
		}
		if live {
			return "", -1, a.held(l, expires, true)
		}
	}
	l.readers = 0
	return mutexPath(l.dir, l.esc), -1, nil
}

// held reports the name busy until expires at the latest. A writer that
// waits for readers makes sure a live intent keeps new readers out
// meanwhile, and keeps its own until it takes the name or gives up. One
// that waits for another writer writes none: the readers that wait with
// it are no stream yet, and may go first (see want).
func (a *mutexAttempt) held(l *look, expires time.Time, readers bool) error {
	l.soonest(expires)
	if a.want != nil && (readers || a.want.nonce != "") {
		if err := a.want.hold(l.j, l.dir, l.esc, l.o); err != nil {
			return err
		}
		l.soonest(a.want.due)
	}
	return ErrLocked
}

func (a *mutexAttempt) taken(l *look) {
	if a.want != nil {
		a.want.dropLocked(l.dir, l.esc) // readers that come now wait for the holder
	}
}

func (a *mutexAttempt) giveUp(c *call) {
	if a.want != nil {
		a.want.drop(c.ctx, c.dir, c.esc)
	}
}

// sharedAttempt takes a name shared (WithShared): a marker in the lowest
// free reader slot <esc>.<i>.lock, while neither an exclusive holder's
// marker nor a waiting writer's intent is live.
type sharedAttempt struct{ noIntent }

func (sharedAttempt) pick(l *look) (string, int, error) {
	// Writer preference: the intent of a writer that waits keeps new
	// readers out.
	for _, p := range []string{mutexPath(l.dir, l.esc), wantPath(l.dir, l.esc)} {
		_, live, expires, err := l.j.examine(p)
		if err != nil {
			return "", -1, err
		}
		if live {
			l.soonest(expires)
			return "", -1, ErrLocked
		}
	}
	for i := 0; ; i++ {
		p := slotPath(l.dir, l.esc, i)
		m, live, _, err := l.j.examine(p)
		if err != nil {
			return "", -1, err
		}
		if !live {
			l.readers = max(l.readers, i+1)
			return p, i, nil
		}
		if m != nil && m.Limit > 1 {
			return "", -1, l.mismatch(m.Limit)
		}
	}
}

// semAttempt takes a permit of a semaphore of n: a marker in a free slot
// <esc>.<i>.lock, i < n.
type semAttempt struct{ noIntent }

func (semAttempt) pick(l *look) (string, int, error) {
	free, slot := "", -1
	for i, p := range markerPaths(l.dir, l.esc, l.limit) {
		m, live, expires, err := l.j.examine(p)
		if err != nil {
			return "", -1, err
		}
		if !live {
			if free == "" {
				free, slot = p, i
				if l.ctr.valid && l.ctr.limit == l.limit {
					break // the counter is sound: no need to see every token
				}
			}
			continue
		}
		if m != nil && m.Limit != 0 && m.Limit != l.limit {
			return "", -1, l.mismatch(m.Limit)
		}
		l.soonest(expires)
	}
	if free == "" {
		return "", -1, ErrLocked
	}
	l.readers = 0
	return free, slot, nil
}
