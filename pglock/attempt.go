package pglock

import (
	"errors"
	"fmt"

	"github.com/ubgo/lock"
)

// permit is a lock just taken on a session, which admit makes a holder.
type permit struct {
	s     *session
	key   int64 // the advisory key held
	slot  int   // a semaphore's permit; 0 otherwise
	token int64
}

// try makes one attempt at a permit on the lock session. A waiter whose
// session ended under the attempt (terminated, or its connection cut:
// Postgres freed all it held) tries once more on the next connection; a
// second loss in a row (a session that cannot work: a pooler, a dying
// server) is returned.
func (c *call) try() (*Holder, error) {
	for retried := false; ; retried = true {
		gen := c.s.generation()
		h, err := c.tryOnce()
		if err == nil || errors.Is(err, ErrLocked) || !c.o.Wait || retried || c.s.generation() == gen {
			return h, err
		}
	}
}

// tryOnce asks the in-process table, then Postgres in one statement.
func (c *call) tryOnce() (*Holder, error) {
	select {
	case c.e.busy <- struct{}{}:
	case <-c.ctx.Done():
		return nil, c.ctx.Err()
	}
	defer func() { <-c.e.busy }()
	a := &attempt{call: c, limit: c.o.Limit()}
	if err := a.local(); err != nil {
		return nil, err
	}
	var h *Holder
	err := c.s.do(c.ctx, true, func(sc *sessionConn) error {
		p, err := a.take(sc)
		if err == nil {
			h = c.admit(p)
		}
		return err
	})
	return h, err
}

// attempt is one try's view of its name.
type attempt struct {
	*call
	limit   int
	slots   []int // a semaphore's permits this factory does not hold
	mine    int   // this factory's holders of the name
	joining bool  // this factory's readers hold the name on the lock session
}

// local checks the in-process table. Postgres lets a session's own locks
// through, so this factory keeps its readers and writers of a name apart
// itself; a reader that does not wait also gives way to a writer waiting
// here.
func (a *attempt) local() error {
	f, e := a.f, a.e
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case f.closed:
		return lock.ErrClosed
	case len(e.held) > 0 && e.limit != a.limit:
		return mismatch(e.name, e.limit, a.limit)
	case a.o.Shared && (len(e.held) > 0 || !a.o.Wait && e.writerWaits()) || !a.o.Shared && len(e.readers) > 0:
		if a.limit > 1 {
			return mismatch(e.name, 1, a.limit)
		}
		return ErrLocked
	}
	a.mine = len(e.held)
	for r := range e.readers {
		a.joining = a.joining || r.s == a.s
	}
	for i := 0; i < a.limit; i++ {
		if e.held[i] == nil {
			a.slots = append(a.slots, i)
		}
	}
	if len(a.slots) == 0 {
		return ErrLocked
	}
	return nil
}

// take sends the attempt's statement.
func (a *attempt) take(sc *sessionConn) (permit, error) {
	st := a.f.st
	switch {
	case a.o.Shared && a.joining:
		return a.single(sc, st.sharedJoin, st.sharedJoinRow, a.e.keys.intent)
	case a.o.Shared:
		return a.single(sc, st.sharedTry, st.sharedTryRow, a.e.keys.intent)
	case a.limit == 1:
		return a.single(sc, st.mutexTry, st.mutexTryRow)
	}
	return a.semaphore(sc)
}

// single runs a statement that takes the mutex key, exclusive or shared
// (see takeArgs).
func (a *attempt) single(sc *sessionConn, q, qRow string, more ...any) (permit, error) {
	var (
		raw int64
		pid int32
	)
	q, args := a.stmt(q, qRow, more...)
	err := sc.queryRow(q, args...).Scan(&raw, &pid)
	tok, err := a.tokenOf(sc, raw, pid, err)
	return permit{s: sc.s, key: a.e.keys.mutex, token: tok}, err
}

// tokenOf turns the answer of a statement that took the name's mutex key
// on sc into the token, giving up the key on a failure.
func (c *call) tokenOf(sc *sessionConn, raw int64, pid int32, err error) (int64, error) {
	e, key, shared := c.e, c.e.keys.mutex, c.o.Shared
	exclusive, sharedKey := []int64{key}, int64(0)
	if shared {
		exclusive, sharedKey = nil, key
	}
	if err != nil {
		return 0, sc.cleanup(err, exclusive, sharedKey)
	}
	if err := sc.checkPID(pid); err != nil {
		return 0, err
	}
	if raw == tryMarker && shared {
		// Rare: the semaphore marker was taken at the check, by a
		// semaphore or by another reader's check.
		q, args := c.stmt(sc.s.f.st.sharedMarker, sc.s.f.st.sharedMarkerRow)
		if err := sc.queryRow(q, args...).Scan(&raw, &pid); err != nil {
			return 0, sc.cleanup(err, exclusive, sharedKey)
		}
		if err := sc.checkPID(pid); err != nil {
			return 0, err
		}
	}
	if raw > 0 && !sc.s.f.validToken(raw) {
		if raw, err = sc.newToken(raw, key, hasRow(c.o)); err != nil {
			return 0, sc.abandon(err, exclusive, sharedKey)
		}
	}
	switch {
	case raw > 0:
		return raw, nil
	case raw == tryHeld:
		return 0, ErrLocked
	case raw == trySemaphore && shared:
		return 0, fmt.Errorf("pglock: %w: %q is held as a semaphore, caller asked for it shared", lock.ErrLimitMismatch, e.name)
	case raw == trySemaphore:
		return 0, fmt.Errorf("pglock: %w: %q is held as a semaphore, caller asked for a mutex", lock.ErrLimitMismatch, e.name)
	}
	// tryLost, or worse: the session is not what we think it is.
	return 0, sc.fail(fmt.Errorf("pglock: unexpected acquire result %d", raw))
}

// errStoredLimit: another limit is stored for the semaphore.
var errStoredLimit = errors.New("pglock: another limit is stored")

// semaphore takes one of the free permits. A name's first use as a
// semaphore, or a change of its limit, takes a statement more.
func (a *attempt) semaphore(sc *sessionConn) (permit, error) {
	for round := 0; ; round++ {
		p, stored, err := a.semTry(sc)
		if !errors.Is(err, errStoredLimit) {
			return p, err
		}
		// The stored limit may change only while nobody holds the name,
		// and never under this factory's own holders.
		if a.mine > 0 || round >= 3 {
			return permit{}, mismatch(a.e.name, stored, a.limit)
		}
		if err := a.relimit(sc, stored); err != nil {
			return permit{}, err
		}
	}
}

// semTry runs sem_acquire.sql once; errStoredLimit comes with the limit in
// force.
func (a *attempt) semTry(sc *sessionConn) (permit, int, error) {
	e := a.e
	keys := make([]int64, len(a.slots))
	slots := make([]int32, len(a.slots))
	for i, s := range a.slots {
		keys[i], slots[i] = advisoryKey(kindSlot, e.prefix, e.name, s), int32(s)
	}
	takeMark := sc.s.marks[e.keys.mark] == 0
	var mark int64 // the marker to give back on failure
	if takeMark {
		mark = e.keys.mark
	}
	owner, meta := row(a.o)
	var (
		slot, stored *int32
		tok          *int64
		pid, status  int32
	)
	err := sc.queryRow(a.f.st.semAcquire, keys, slots, e.keys.mark, takeMark, e.keys.mutex, e.keys.limit, int32(a.limit),
		e.prefix, e.name, owner, meta).Scan(&slot, &tok, &stored, &pid, &status)
	if err != nil {
		return permit{}, 0, sc.cleanup(err, keys, mark)
	}
	if err := sc.checkPID(pid); err != nil {
		return permit{}, 0, err
	}
	switch status {
	case semTaken:
		p := permit{s: sc.s, key: advisoryKey(kindSlot, e.prefix, e.name, int(*slot)), slot: int(*slot), token: *tok}
		if !a.f.validToken(p.token) {
			if p.token, err = sc.newToken(p.token, p.key, hasRow(a.o)); err != nil {
				return permit{}, 0, sc.abandon(err, []int64{p.key}, mark)
			}
		}
		sc.s.marks[e.keys.mark]++
		return p, 0, nil
	case semBusy:
		return permit{}, 0, ErrLocked
	case semMismatch:
		return permit{}, int(*stored), errStoredLimit
	case semCollision:
		return permit{}, 0, fmt.Errorf("%w: %q and the stored name of its limits row", ErrKeyCollision, e.name)
	case semMutex:
		return permit{}, 0, fmt.Errorf("pglock: %w: %q is held as a mutex, caller asked for limit %d", lock.ErrLimitMismatch, e.name, a.limit)
	case semShared:
		return permit{}, 0, fmt.Errorf("pglock: %w: %q is held shared, caller asked for limit %d", lock.ErrLimitMismatch, e.name, a.limit)
	}
	return permit{}, 0, sc.fail(fmt.Errorf("pglock: unexpected semaphore status %d", status))
}

// relimit stores the caller's limit in place of stored, if nobody holds a
// permit of either.
func (a *attempt) relimit(sc *sessionConn, stored int) error {
	e := a.e
	all := make([]int64, max(stored, a.limit))
	for i := range all {
		all[i] = advisoryKey(kindSlot, e.prefix, e.name, i)
	}
	var done, pid int32
	if err := sc.queryRow(a.f.st.relimit, all, e.keys.limit, int32(a.limit), e.prefix, e.name).Scan(&done, &pid); err != nil {
		return sc.cleanup(err, nil, 0)
	}
	if err := sc.checkPID(pid); err != nil {
		return err
	}
	if done == relimitCollision {
		return fmt.Errorf("%w: %q and the stored name of its limits row", ErrKeyCollision, e.name)
	}
	// relimitBusy: permits are held, by holders of another limit (a
	// mismatch the next round reports again) or of our own limit, set by
	// another session meanwhile (the next round takes one).
	return nil
}

func mismatch(name string, have, want int) error {
	return fmt.Errorf("pglock: %w: %q has limit %d, caller asked for %d", lock.ErrLimitMismatch, name, have, want)
}

// hasRow reports whether the acquire writes the holder's row, for Inspect
// and List: when the call set an owner or metadata.
func hasRow(o *lock.Options) bool { return o.Owner != "" || len(o.Metadata) > 0 }

// stmt picks, of a statement that takes the name's mutex key, the form q
// or the one that also writes the holder's row (qRow), and its arguments:
// the keys, the token counter, more, and the row's.
func (c *call) stmt(q, qRow string, more ...any) (string, []any) {
	e := c.e
	args := append([]any{e.keys.mutex, e.keys.mark, c.f.st.counter}, more...)
	if !hasRow(c.o) {
		return q, args
	}
	owner, meta := row(c.o)
	return qRow, append(args, e.prefix, e.name, owner, meta)
}

// row is what a holder's row stores besides its lock: the owner, and the
// metadata as a JSON object (nil: none).
func row(o *lock.Options) (owner string, meta *string) {
	if len(o.Metadata) > 0 {
		m := jsonObject(o.Metadata)
		meta = &m
	}
	return o.Owner, meta
}
