package lock

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"time"
)

// An Option configures a backend. The same options are accepted by every
// backend's NewFactory (as defaults) and by each Acquire or WithLock call
// (overriding the defaults for that call). Backends re-export the ones they
// honour under the same names, and add their own with WithValue.
type Option func(*Options)

// Options is the resolved configuration of one Acquire. Backends read it;
// applications set it through Option values.
type Options struct {
	MaxConcurrent int               // permits per name; 1 (a mutex) unless set
	Wait          bool              // wait for the lock instead of failing with ErrLocked
	WaitTimeout   time.Duration     // with Wait, the longest an Acquire waits; 0: until its context ends
	TTL           time.Duration     // lease length, for backends that lease; 0 means the backend's default
	KeyPrefix     string            // namespace for the backend's keys
	Dir           string            // directory for file-based backends
	Owner         string            // who holds the lock, for operators (a trace or job id)
	Metadata      map[string]string // free-form, shown by Inspect and in markers
	NoAutoRenew   bool              // WithAutoRenew(false): only Extend renews a lease
	MaxHold       time.Duration     // WithMaxHold: the longest a holder keeps the lock; 0: no bound
	Shared        bool              // WithShared: hold the name in shared (read) mode
	Logger        *slog.Logger      // nil: slog.Default(); WithLogger(nil) sets one that discards
	Observer      Observer          // metrics and tracing hook; nil: none

	values map[any]any
	errs   []error
}

// Apply returns a copy of base with opts applied in order. The error matches
// ErrInvalidOption when any option was given a value it cannot take.
func Apply(base Options, opts ...Option) (Options, error) {
	o := base
	o.errs = nil
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	if o.Shared && o.MaxConcurrent > 1 && !(base.Shared && base.MaxConcurrent > 1) { // base reported it already
		o.invalid("WithShared with WithMaxConcurrent(%d): a name is either shared or a semaphore", o.MaxConcurrent)
	}
	err := errors.Join(append(base.errs[:len(base.errs):len(base.errs)], o.errs...)...)
	return o, err
}

func (o *Options) invalid(format string, args ...any) {
	o.errs = append(o.errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalidOption}, args...)...))
}

// Invalid records that an option was given a value it cannot take; Apply
// then returns an error matching ErrInvalidOption. Backends use it in their
// own options.
func (o *Options) Invalid(msg string) { o.invalid("%s", msg) }

// Limit is MaxConcurrent with its default applied.
func (o *Options) Limit() int {
	if o.MaxConcurrent == 0 {
		return 1
	}
	return o.MaxConcurrent
}

// Value returns the backend-specific setting stored under key by WithValue,
// or nil.
func (o *Options) Value(key any) any { return o.values[key] }

// WithMaxConcurrent turns the name into a semaphore with n permits. Every
// holder of a name must use the same n; a different n gets ErrLimitMismatch.
func WithMaxConcurrent(n int) Option {
	return func(o *Options) {
		if n < 1 {
			o.invalid("WithMaxConcurrent(%d): need at least 1", n)
			return
		}
		o.MaxConcurrent = n
	}
}

// WithWait makes Acquire wait until the lock is free or its context ends,
// instead of failing at once with ErrLocked. A wait that ends with its
// context while the name is held returns a *WaitError, which matches both
// ErrLocked and the context's error; one that ends because the backend
// failed returns the failure, which does not match ErrLocked (see
// WaitError).
func WithWait() Option { return func(o *Options) { o.Wait = true } }

// WithWaitTimeout makes Acquire wait, as WithWait does, but for at most
// d: a wait that runs out returns a *WaitError matching ErrLocked and
// context.DeadlineExceeded. It bounds the wait alone: unlike a deadline on
// the Acquire context, it does not end the work WithLock runs once the
// lock is held.
func WithWaitTimeout(d time.Duration) Option {
	return func(o *Options) {
		if d <= 0 {
			o.invalid("WithWaitTimeout(%v): must be positive", d)
			return
		}
		o.Wait, o.WaitTimeout = true, d
	}
}

// WithTTL sets the lease length of lease backends: how long a crashed
// holder keeps the lock before it frees by itself.
func WithTTL(d time.Duration) Option {
	return func(o *Options) {
		if d <= 0 {
			o.invalid("WithTTL(%v): must be positive", d)
			return
		}
		o.TTL = d
	}
}

// WithKeyPrefix puts every key the backend writes under prefix, so that
// several applications can share one server.
func WithKeyPrefix(prefix string) Option { return func(o *Options) { o.KeyPrefix = prefix } }

// WithDir sets the directory of file-based backends.
func WithDir(dir string) Option {
	return func(o *Options) {
		if dir == "" {
			o.invalid("WithDir(\"\"): empty directory")
			return
		}
		o.Dir = dir
	}
}

// WithOwner records who holds the lock (a job id, a trace id) where
// operators and Inspect can see it.
func WithOwner(owner string) Option { return func(o *Options) { o.Owner = owner } }

// WithMetadata adds a key/value pair shown by Inspect and in markers.
func WithMetadata(key, value string) Option {
	return func(o *Options) {
		o.Metadata = maps.Clone(o.Metadata)
		if o.Metadata == nil {
			o.Metadata = map[string]string{}
		}
		o.Metadata[key] = value
	}
}

// WithAutoRenew(false) turns off the background renewal of leases. By
// default every lease backend (redislock, etcdlock, filelock, memlock with
// a TTL) renews the lease of every lock it hands out, from Acquire as from
// WithLock and AsLocker, for as long as it is held: a lock is lost only
// when its process cannot reach the store (or pauses) for longer than the
// TTL, or is killed. With WithAutoRenew(false) the lease runs out one TTL
// after Acquire unless the holder calls Extend ([Extender], or
// [KeepAlive]) — the way to give a crashed holder's lock a fixed bound;
// [WithMaxHold] bounds a live, stuck one however it is renewed.
func WithAutoRenew(on bool) Option { return func(o *Options) { o.NoAutoRenew = !on } }

// WithMaxHold bounds how long a lock is held: d after the Acquire, the
// backend stops renewing it, declares it lost — Done closes, Err matches
// ErrMaxHold and ErrLockLost, WithLock's context is cancelled with that
// cause — and releases it, so a stuck job cannot keep a name for ever,
// however it is renewed (the backend's own renewal, Extend, KeepAlive).
// Releasing at d holds for every backend, leased or not: a lease is not
// left to linger for a TTL, and a session or kernel lock is freed too.
// A d shorter than the TTL is allowed: the lock then simply ends at d.
// Each holder (each semaphore permit) is bounded on its own, from its
// own Acquire; d must be positive.
func WithMaxHold(d time.Duration) Option {
	return func(o *Options) {
		if d <= 0 {
			o.invalid("WithMaxHold(%v): must be positive", d)
			return
		}
		o.MaxHold = d
	}
}

// WithShared takes the name in shared (read) mode: any number of shared
// holders hold it together, while an exclusive holder (an Acquire without
// WithShared) holds it alone. The preference is the writers': once an
// exclusive Acquire waits for the name, new shared Acquires wait behind
// it (or fail with ErrLocked without WithWait), even while the name is
// held shared, so a stream of readers never starves a writer.
//
// Tokens are drawn from the name's one counter: a shared holder's token
// is above every exclusive holder's before it, and an exclusive holder's
// above every shared holder's before it, so a fence can check both kinds.
// Shared holders of one moment have distinct tokens.
//
// A name is either shared or a semaphore: WithShared with
// WithMaxConcurrent(n > 1) is ErrInvalidOption. A backend that cannot
// order shared and exclusive holders safely refuses WithShared with
// ErrInvalidOption rather than take an exclusive lock instead.
func WithShared() Option { return func(o *Options) { o.Shared = true } }

// WithLogger sets the logger. Acquisitions, releases and contention are
// logged at Debug, failures at Warn, lost locks at Warn. A nil logger turns
// logging off.
func WithLogger(l *slog.Logger) Option {
	if l == nil {
		l = discard
	}
	return func(o *Options) { o.Logger = l }
}

// WithObserver adds a hook that receives an Event for every operation,
// for metrics and tracing. Observers add up: each WithObserver, to
// NewFactory or to one call, adds one, and every one receives every Event
// in the order they were given (promlock and otellock on one factory). nil
// adds nothing.
func WithObserver(obs Observer) Option {
	return func(o *Options) { o.Observer = joinObservers(o.Observer, obs) }
}

// WithValue stores a backend-specific setting under key, which should be of
// an unexported type of the backend's, as with context.WithValue.
func WithValue(key, value any) Option {
	return func(o *Options) {
		o.values = maps.Clone(o.values)
		if o.values == nil {
			o.values = map[any]any{}
		}
		o.values[key] = value
	}
}

var discard = slog.New(slog.DiscardHandler)
