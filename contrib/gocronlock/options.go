package gocronlock

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/ubgo/lock"
)

// Defaults. They are chosen for jobs that run every second or less often,
// on replicas whose timers fire within half a second of each other.
const (
	DefaultKeyPrefix     = "gocron:"
	DefaultMinHold       = 500 * time.Millisecond
	DefaultRetryInterval = time.Second
	DefaultTakeoverDelay = 500 * time.Millisecond
	DefaultLockTimeout   = 5 * time.Second
)

// An Option configures a Locker (New) or an Elector (NewElector). Each
// option's doc says which of the two it affects; the other ignores it.
type Option func(*config)

type config struct {
	prefix      string
	minHold     time.Duration
	resolution  time.Duration
	extendEvery time.Duration
	anyName     bool
	retry       time.Duration
	takeover    time.Duration
	lockTimeout time.Duration
	logger      *slog.Logger
	noLog       bool
	errs        []error
}

func resolve(opts []Option) config {
	c := config{
		prefix:      DefaultKeyPrefix,
		minHold:     DefaultMinHold,
		retry:       DefaultRetryInterval,
		takeover:    DefaultTakeoverDelay,
		lockTimeout: DefaultLockTimeout,
	}
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	return c
}

func (c *config) invalid(format string, args ...any) {
	c.errs = append(c.errs, fmt.Errorf("gocronlock: %w: "+format, append([]any{lock.ErrInvalidOption}, args...)...))
}

// nonNegative is the Option named name that sets the duration at field to
// d, or reports d invalid if it is negative.
func nonNegative(name string, d time.Duration, field func(*config) *time.Duration) Option {
	return bounded(name, d, d >= 0, "must not be negative", field)
}

// positive is nonNegative for options where 0 makes no sense either.
func positive(name string, d time.Duration, field func(*config) *time.Duration) Option {
	return bounded(name, d, d > 0, "must be positive", field)
}

func bounded(name string, d time.Duration, ok bool, rule string, field func(*config) *time.Duration) Option {
	return func(c *config) {
		if !ok {
			c.invalid("%s(%v): %s", name, d, rule)
			return
		}
		*field(c) = d
	}
}

func (c *config) log() *slog.Logger {
	switch {
	case c.noLog:
		return slog.New(slog.DiscardHandler)
	case c.logger != nil:
		return c.logger
	}
	return slog.Default()
}

// WithKeyPrefix sets what goes in front of every lock name the Locker or
// Elector asks its lock.Locker for, so that gocron's locks do not meet the
// application's own locks of the same name. Default DefaultKeyPrefix. The
// empty prefix is allowed.
func WithKeyPrefix(prefix string) Option { return func(c *config) { c.prefix = prefix } }

// WithMinHold makes the Locker keep a run's job lock at least until d has
// passed since Lock, even when the job finished sooner. The release happens
// in the background, so gocron is not held up. Runs under gocron keep the
// lock longer anyway: the replica that runs a job keeps it for the job's
// next tick (see the guide); the minimum bounds the hold of a job that
// ended after one tick, and of a Lock whose context never ends
// (context.Background). 0 sets no minimum.
// Default DefaultMinHold.
func WithMinHold(d time.Duration) Option {
	return nonNegative("WithMinHold", d, func(c *config) *time.Duration { return &c.minHold })
}

// WithTickResolution makes the Locker also take a lock per scheduled run,
// named prefix + job name + "@" + the Lock time rounded to d (RFC 3339, UTC),
// and keep it for a while after Lock (the guide's Tick locks). Replicas
// whose timers round to the same tick share that lock, so only the first
// runs the tick, however soon it finishes. d must not exceed the job's
// interval, and the job's times should fall on multiples of d (cron jobs
// do at d = 1s; give duration jobs gocron.WithStartAt). 0 turns tick locks
// off. Default: off.
func WithTickResolution(d time.Duration) Option {
	return nonNegative("WithTickResolution", d, func(c *config) *time.Duration { return &c.resolution })
}

// WithExtendEvery makes the Locker renew the locks of a run whose holder
// implements lock.Extender every d, with lock.KeepAlive, until they are
// released. The holders of the family's AsLocker already renew themselves;
// this is for a lock.Locker built with WithAutoRenew(false) or one from
// elsewhere. A renewal that fails, or takes longer than d, marks the run's
// lock lost (see JobContext): the lease can no longer be vouched for. 0
// turns it off. Default: off.
func WithExtendEvery(d time.Duration) Option {
	return nonNegative("WithExtendEvery", d, func(c *config) *time.Duration { return &c.extendEvery })
}

// WithAllowFuncNames turns off the check that rejects job names shaped like
// a Go function name ("main.syncJob", "example.com/app/jobs.(*T).Run-fm"),
// which is what gocron names a job given no gocron.WithName. Use it only if
// such names are your jobs' real, distinct names.
func WithAllowFuncNames() Option { return func(c *config) { c.anyName = true } }

// WithRetryInterval sets how long an Elector waits between campaigns when
// the lock is taken or the backend fails, and after losing leadership.
// Default DefaultRetryInterval. A lock.Locker built with WithWait needs no
// polling: its Acquire returns as soon as the lock is free.
func WithRetryInterval(d time.Duration) Option {
	return positive("WithRetryInterval", d, func(c *config) *time.Duration { return &c.retry })
}

// WithTakeoverDelay makes an Elector that has just won the lock wait d
// before IsLeader reports it leader, so that a tick the previous leader ran
// just before losing is not run again by a new leader whose timer fires up
// to d later. 0 makes the winner leader at once. Default
// DefaultTakeoverDelay.
func WithTakeoverDelay(d time.Duration) Option {
	return nonNegative("WithTakeoverDelay", d, func(c *config) *time.Duration { return &c.takeover })
}

// WithLockTimeout bounds each Lock: the Acquire calls of one run get a
// context that ends d after Lock was called (or sooner, with the job's
// context). gocron calls Lock synchronously with the job's context, which
// has no deadline, and schedules the job's next run only once Lock returns,
// so a backend that does not answer would otherwise hold the job for the
// whole outage and run a stale tick when it came back. A Lock that runs out
// fails with an error that matches context.DeadlineExceeded and not
// lock.ErrLocked. d must be positive. Default DefaultLockTimeout. It does
// not apply to an Elector, whose campaign waits on purpose.
func WithLockTimeout(d time.Duration) Option {
	return positive("WithLockTimeout", d, func(c *config) *time.Duration { return &c.lockTimeout })
}

// WithLogger sets where the Locker and Elector log (rejected job names and
// lost locks at Warn, leadership changes at Info). nil turns logging off.
// Default: slog.Default().
func WithLogger(l *slog.Logger) Option {
	return func(c *config) { c.logger, c.noLog = l, l == nil }
}
