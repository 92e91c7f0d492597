package memlock

import (
	"log/slog"
	"sync"
	"time"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/backend"
)

// Option configures the factory (defaults) or one call (overrides). The
// options mean the same in every backend of the family.
type Option = lock.Option

// WithMaxConcurrent makes the name a semaphore of n permits.
func WithMaxConcurrent(n int) Option { return lock.WithMaxConcurrent(n) }

// WithWait makes Acquire wait, in FIFO order, until a permit is free.
func WithWait() Option { return lock.WithWait() }

// WithWaitTimeout makes Acquire wait for at most d; see lock.WithWaitTimeout.
func WithWaitTimeout(d time.Duration) Option { return lock.WithWaitTimeout(d) }

// WithTTL gives each lock a lease of d, renewed while held unless
// WithAutoRenew(false) is given: then a holder that neither releases nor
// extends within d loses the lock. Without a TTL memlock locks never expire.
func WithTTL(d time.Duration) Option { return lock.WithTTL(d) }

// WithAutoRenew(false) lets a lease run out one TTL after Acquire or the
// last Extend; see lock.WithAutoRenew. A renewed lock (the default) is lost
// only through ForceLoss or Close.
func WithAutoRenew(on bool) Option { return lock.WithAutoRenew(on) }

// WithMaxHold ends a lock d after its Acquire, by the factory's clock
// (WithClock): it is lost with ErrMaxHold and its permit handed on; see
// lock.WithMaxHold.
func WithMaxHold(d time.Duration) Option { return lock.WithMaxHold(d) }

// WithShared takes the name in shared mode, beside other shared holders;
// see lock.WithShared. Writers are preferred: waiters are served in FIFO
// order, so a reader queues behind a writer that waits.
func WithShared() Option { return lock.WithShared() }

// WithOwner records who holds the lock, for Inspect.
func WithOwner(owner string) Option { return lock.WithOwner(owner) }

// WithMetadata adds a key/value pair shown by Inspect.
func WithMetadata(key, value string) Option { return lock.WithMetadata(key, value) }

// WithLogger sets the logger; nil turns logging off. Default: slog.Default().
func WithLogger(l *slog.Logger) Option { return lock.WithLogger(l) }

// WithObserver sets the metrics and tracing hook.
func WithObserver(obs lock.Observer) Option { return lock.WithObserver(obs) }

type clockKey struct{}

// WithClock makes leases expire by c instead of the system clock. It is a
// factory option.
func WithClock(c Clock) Option { return backend.Value(backendName, "WithClock", clockKey{}, c) }

// A Clock tells time and runs functions later. ManualClock is the one for
// tests.
type Clock interface {
	Now() time.Time
	// AfterFunc runs f once d has passed; stop cancels it and reports
	// whether it did so before f ran.
	AfterFunc(d time.Duration, f func()) (stop func() bool)
}

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }
func (systemClock) AfterFunc(d time.Duration, f func()) func() bool {
	return time.AfterFunc(d, f).Stop
}

// ManualClock is a Clock that moves only when told to, so tests can expire
// leases without sleeping.
type ManualClock struct {
	mu     sync.Mutex
	now    time.Time
	timers map[*manualTimer]struct{}
}

type manualTimer struct {
	at time.Time
	f  func()
}

// NewManualClock returns a clock reading start.
func NewManualClock(start time.Time) *ManualClock {
	return &ManualClock{now: start, timers: map[*manualTimer]struct{}{}}
}

// Now returns the clock's time.
func (c *ManualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// AfterFunc schedules f for d from now.
func (c *ManualClock) AfterFunc(d time.Duration, f func()) func() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &manualTimer{at: c.now.Add(d), f: f}
	c.timers[t] = struct{}{}
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		_, pending := c.timers[t]
		delete(c.timers, t)
		return pending
	}
}

// Advance moves the clock forward by d and runs, in the calling goroutine,
// every function that has come due.
func (c *ManualClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	var due []func()
	for t := range c.timers {
		if !t.at.After(c.now) {
			due = append(due, t.f)
			delete(c.timers, t)
		}
	}
	c.mu.Unlock()
	for _, f := range due {
		f()
	}
}
