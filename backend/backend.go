// Package backend holds the pieces that lock backends share: holder state,
// name escaping, and the adapters between a factory and lock.Locker.
// Applications do not need it; authors of a new backend do, much as a
// database/sql driver uses database/sql/driver.
package backend

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/ubgo/lock"
)

// State tracks whether a holder still has its lock. The zero value is not
// usable; call NewState.
type State struct {
	done  chan struct{}
	mu    sync.Mutex
	err   error
	ended bool
	stop  func() bool // stops the WithMaxHold timer (see Bound); nil without one
}

// NewState returns the state of a freshly acquired lock.
func NewState() *State { return &State{done: make(chan struct{})} }

// Done is closed once the lock is released or lost.
func (s *State) Done() <-chan struct{} { return s.done }

// Err is nil while held and after a clean release, and the loss error after
// Lose.
func (s *State) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// Lose records that the lock was lost with err (which should match
// lock.ErrLockLost) and closes Done. It reports false, changing nothing, if
// the lock had already been released or lost.
func (s *State) Lose(err error) bool { return s.end(err) }

// End records a clean release and closes Done. It reports false, changing
// nothing, if the lock had already been released or lost.
func (s *State) End() bool { return s.end(nil) }

func (s *State) end(err error) bool {
	s.mu.Lock()
	if s.ended {
		s.mu.Unlock()
		return false
	}
	s.ended, s.err = true, err
	close(s.done)
	stop := s.stop
	s.stop = nil
	s.mu.Unlock()
	if stop != nil {
		stop() // outside s.mu: a clock's stop may take a lock of its own
	}
	return true
}

// Bound arms lock.WithMaxHold for a holder whose lock was just taken:
// once o.MaxHold has passed (never when it is 0), end runs with an error
// that matches lost (the backend's ErrLockLost) and lock.ErrMaxHold and
// says so. end must do what the backend does with a loss its own clock
// finds: close Done first (Lose) and report the loss, then free the lock
// in the store if it is still the holder's, as Release would, so that a
// stuck holder neither keeps the name nor leaves a lease to linger. The
// loss ends the holder's renewal, as any loss does. The timer stops when
// the state ends first, by Release or another loss. after is the
// backend's clock, in time.AfterFunc's shape (stop cancels f and reports
// whether it did so before f ran), so that memlock's ManualClock can drive
// it; nil means time.AfterFunc. Call Bound once the holder
// is registered, before it is handed out.
func (s *State) Bound(o *lock.Options, lost error, after func(d time.Duration, f func()) (stop func() bool), end func(error)) {
	d := o.MaxHold
	if d <= 0 {
		return
	}
	if after == nil {
		after = func(d time.Duration, f func()) func() bool { return time.AfterFunc(d, f).Stop }
	}
	err := Loss(lost, lock.ErrMaxHold, "held for %v, its WithMaxHold", d)
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.ended {
		s.stop = after(d, func() { end(err) })
	}
}

// Loss is a holder's loss error: it reads "<lost>: <detail>" and matches
// lost (the backend's ErrLockLost) and why, the root's error that says
// why (lock.ErrLeaseExpired, ErrSessionEnded, ErrRemoved, ErrMaxHold,
// ErrClosed), which lock.ReasonOf reads.
func Loss(lost, why error, format string, args ...any) error {
	return &lossError{lost: lost, why: why, detail: fmt.Sprintf(format, args...)}
}

type lossError struct {
	lost, why error
	detail    string
}

func (e *lossError) Error() string   { return e.lost.Error() + ": " + e.detail }
func (e *lossError) Unwrap() []error { return []error{e.lost, e.why} }

// Ended reports whether the lock was released or lost.
func (s *State) Ended() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ended
}

// ReleaseTimeout bounds the work of a Release, which runs on a context of
// its own because the caller's may already be cancelled.
const ReleaseTimeout = 10 * time.Second

// ReleaseContext returns the detached, bounded context a Release runs on.
// It keeps ctx's values (trace ids for the logs) but not its cancellation.
func ReleaseContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), ReleaseTimeout)
}

// maxEscaped is the longest escaped name kept verbatim; longer ones are
// shortened and suffixed with a hash, which keeps file names under the
// usual 255-byte limit with room for a slot suffix.
const maxEscaped = 160

// Escape maps a valid name injectively to a string of [A-Za-z0-9_-%~]
// that contains no '/' or '.', so a backend can append ".0", ":fence" or
// "/x" without meeting another name's key. Bytes outside [A-Za-z0-9_-] are
// percent-encoded; a result longer than 160 bytes is cut to 96 and followed
// by '~' and a SHA-256 of the whole name ('~' appears in no unhashed result).
func Escape(name string) string {
	if verbatim(name) {
		return name // the common case, without an allocation
	}
	s := escapeBytes(name)
	if len(s) <= maxEscaped {
		return s
	}
	sum := sha256.Sum256([]byte(name))
	cut := s[:96]
	if i := strings.LastIndexByte(cut[len(cut)-2:], '%'); i >= 0 {
		cut = cut[:len(cut)-2+i] // do not split a %XX escape
	}
	return cut + "~" + hex.EncodeToString(sum[:])
}

// endedBy reports whether err is ctx's ending, not yet said as a WaitError
// or a failed wait.
func endedBy(ctx context.Context, err error) bool {
	var fw *failedWait
	if ctx.Err() == nil || errors.Is(err, lock.ErrLocked) || errors.As(err, &fw) {
		return false
	}
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Cause(ctx))
}

// Grace is how long past the end of its ctx (its deadline, its
// cancellation, or WithWaitTimeout) an Acquire may take, whatever the
// store does: answer, refuse, reset or go silent. It bounds the probe of a
// wait that ended without a fresh answer, and an Acquire whose store has
// not answered by then returns without it (see Take).
const Grace = 250 * time.Millisecond

// Fresh is how old the store's last "held" answer may be for a wait that
// ended with its ctx to say so (a lock.WaitError, matching
// lock.ErrLocked); an older one is checked by the probe.
const Fresh = time.Second

// failedWait is the error of a waiting Acquire that ended because the
// backend failed: it matches the ctx's cause and the failure, never
// lock.ErrLocked (unless the failure does).
type failedWait struct{ cause, err error }

func (e *failedWait) Error() string {
	return e.err.Error() + ": gave up waiting: " + e.cause.Error()
}
func (e *failedWait) Unwrap() []error { return []error{e.cause, e.err} }

// failure returns err, the failure of an attempt, said as a wait that gave
// up if ctx has ended.
func failure(ctx context.Context, err error) error {
	if ctx.Err() == nil {
		return err
	}
	return &failedWait{cause: context.Cause(ctx), err: err}
}

// verbatim reports whether Escape keeps name as it is.
func verbatim(name string) bool {
	if len(name) > maxEscaped {
		return false
	}
	for i := 0; i < len(name); i++ {
		if !safe(name[i]) {
			return false
		}
	}
	return true
}

// safe reports whether Escape keeps byte c as it is.
func safe(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-'
}

// CheckStore is what a Fence or Ledger method checks before it sends
// anything: the store's own configuration error, ctx, and the key, which
// must be a valid lock name.
func CheckStore(ctx context.Context, storeErr error, key string) error {
	if storeErr != nil {
		return storeErr
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return lock.ValidateName(key)
}

// Take runs the rest of a factory's Acquire once its options are resolved
// (err is Resolve's error; take is not run when it is set): take, on a
// context bounded by o.WaitTimeout when set (lock.WithWaitTimeout; the
// holder does not depend on it), and reports the outcome as one
// lock.OpAcquire event through o.
//
// With WithWait, an error that comes from ctx ending — before the first
// attempt, during one, or while a session, lease or watch is set up — and
// is not yet said by Wait is a lock.WaitError on c.Locked if c.Probe
// succeeds (or is nil), and a failed wait carrying the probe's error if
// it fails: an outage never matches ErrLocked.
//
// A backend whose store can fail (c.Probe set) returns within Grace of
// ctx's end whatever the store and its client do: take runs on a
// goroutine of its own, and one still running then is left to finish in
// the background (a lock it gets is released). The error is then decided
// by what the attempts learnt: a lock.WaitError if the last one, sent
// within Fresh, found the name held; otherwise an error that says the
// store did not answer and never matches lock.ErrLocked.
func Take[H lock.Holder](ctx context.Context, c Call, o *lock.Options, err error, take func(ctx context.Context) (H, time.Duration, error)) (H, error) {
	if o.WaitTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, o.WaitTimeout)
		defer cancel()
	}
	var h H
	var wait time.Duration
	if err == nil {
		run := func(ctx context.Context) (H, time.Duration, error) {
			h, wait, err := take(ctx)
			switch {
			case err == nil || !endedBy(ctx, err):
			case o.Wait:
				err = gaveUp(ctx, c.Locked, c.Probe)
			case err == ctx.Err():
				err = fmt.Errorf("%s: acquire: %w", c.Backend, err)
			}
			return h, wait, err
		}
		if c.Probe == nil || ctx.Done() == nil {
			h, wait, err = run(ctx)
		} else {
			h, wait, err = bounded(ctx, c, o.Wait, run)
		}
	}
	return finish(ctx, c, o, h, wait, err)
}

// bounded runs run on a goroutine of its own and returns its result, or,
// if it has not returned within Grace of ctx's end, an error decided by
// the evidence its attempts left (see Take).
func bounded[H lock.Holder](ctx context.Context, c Call, wait bool, run func(ctx context.Context) (H, time.Duration, error)) (H, time.Duration, error) {
	type result struct {
		h    H
		wait time.Duration
		err  error
	}
	ev := &evidence{start: time.Now()}
	ctx = context.WithValue(ctx, evidenceKey{}, ev)
	done := make(chan result, 1)
	go func() {
		h, wait, err := run(ctx)
		done <- result{h, wait, err}
	}()
	var cut <-chan time.Time
	select {
	case r := <-done:
		return r.h, r.wait, r.err
	case <-ctx.Done():
		t := time.NewTimer(Grace)
		defer t.Stop()
		cut = t.C
	}
	select {
	case r := <-done:
		return r.h, r.wait, r.err
	case <-cut:
	}
	go func() {
		if r := <-done; r.err == nil {
			r.h.Release() // taken too late for the caller
		}
	}()
	var zero H
	return zero, ev.waited(), ev.late(ctx, c, wait)
}

// A Call names one Acquire for Take.
type Call struct {
	Backend string    // the backend's name, for the event
	Name    string    // the lock name
	Locked  error     // the backend's ErrLocked, which a WaitError wraps
	Start   time.Time // when the call began
	// Probe, if set, asks the backend a question (a ping) that fails when
	// it is down. Take runs it, on a context of its own bounded by Grace,
	// when a wait's ctx ended with no fresh answer on whether the name was
	// held; and bounds every Acquire of a backend that sets it (see Take).
	// Backends that cannot fail leave it nil.
	Probe func(ctx context.Context) error
}

// finish ends a factory's Acquire: it reports the outcome as one
// lock.OpAcquire event (latency from c.Start, the wait spent queued, the
// token) through o. It returns h and the error to give the caller.
func finish[H lock.Holder](ctx context.Context, c Call, o *lock.Options, h H, wait time.Duration, err error) (H, error) {
	e := lock.Event{Backend: c.Backend, Op: lock.OpAcquire, Name: c.Name, Latency: time.Since(c.Start), Wait: wait, Err: err}
	if err == nil {
		e.Token = h.Token()
	}
	Report(ctx, o, e)
	return h, err
}

// gaveUp is the error of a wait whose ctx ended before any attempt could
// tell whether the name was held: probe decides between contention and
// an outage.
func gaveUp(ctx context.Context, locked error, probe func(context.Context) error) error {
	if probe != nil {
		pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), Grace)
		defer cancel()
		if err := probe(pctx); err != nil {
			if pctx.Err() != nil {
				err = fmt.Errorf("%w: no answer within %v", err, Grace)
			}
			return failure(ctx, err)
		}
	}
	return lock.NewWaitError(locked, ctx)
}

// evidence is what the attempts of one bounded Acquire learnt from the
// store, for an Acquire given up while one is still on its way. Wait
// finds it in its ctx.
type evidence struct {
	start time.Time // when the Acquire began
	mu    sync.Mutex
	held  time.Time // when the last attempt, if it found the name held, was sent
	heard time.Time // when the last attempt that got an answer was sent
	first time.Time // when the first attempt found the name held: the wait began
}

type evidenceKey struct{}

func evidenceOf(ctx context.Context) *evidence {
	ev, _ := ctx.Value(evidenceKey{}).(*evidence)
	return ev
}

// answered records an attempt sent at sent that ended with err: held if
// err is contention, an answer unless ctx ended it.
func (e *evidence) answered(sent time.Time, err error) {
	if e == nil {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.held = time.Time{}
	switch {
	case errors.Is(err, lock.ErrLocked):
		e.held, e.heard = sent, sent
		if e.first.IsZero() {
			e.first = sent
		}
	case err == nil || !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded):
		e.heard = sent
	}
}

// waited is the time spent waiting since the first contention.
func (e *evidence) waited() time.Duration {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.first.IsZero() {
		return 0
	}
	return time.Since(e.first)
}

// late is the error of an Acquire whose store did not answer within
// Grace of ctx's end.
func (e *evidence) late(ctx context.Context, c Call, wait bool) error {
	e.mu.Lock()
	held, heard := e.held, e.heard
	e.mu.Unlock()
	if wait && !held.IsZero() && time.Since(held) <= Fresh {
		return lock.NewWaitError(c.Locked, ctx)
	}
	since := "since the call began"
	if !heard.IsZero() {
		since = fmt.Sprintf("for %v", time.Since(heard).Round(time.Millisecond))
	}
	err := fmt.Errorf("%s: acquire: no answer from the store %s", c.Backend, since)
	if wait {
		return failure(ctx, err)
	}
	return fmt.Errorf("%w: %w", err, context.Cause(ctx))
}
