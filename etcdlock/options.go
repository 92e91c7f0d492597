package etcdlock

import (
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/ubgo/lock"
)

// Option configures the factory (defaults) or one call (overrides). The
// options mean the same in every backend of the family.
type Option = lock.Option

// Defaults.
const (
	// DefaultTTL is the lease length when WithTTL is not given: how long a
	// crashed process keeps its locks.
	DefaultTTL = 60 * time.Second
	// DefaultKeyPrefix is the key prefix when WithKeyPrefix is not given.
	DefaultKeyPrefix = "ubgo-lock/"
)

// WithMaxConcurrent makes the name a semaphore of n permits. Every holder of
// a name must use the same n; a different n gets an error matching
// lock.ErrLimitMismatch.
func WithMaxConcurrent(n int) Option { return lock.WithMaxConcurrent(n) }

// WithWait makes Acquire wait, in FIFO order, until a permit is free or its
// context ends, woken by an etcd watch.
func WithWait() Option { return lock.WithWait() }

// WithWaitTimeout makes Acquire wait for at most d; see lock.WithWaitTimeout.
func WithWaitTimeout(d time.Duration) Option { return lock.WithWaitTimeout(d) }

// WithTTL sets the lease length: how long the locks of a process that died
// (or lost touch with etcd) stay held. etcd leases count whole seconds, so d
// must be a positive whole number of seconds; anything else is an error
// matching lock.ErrInvalidOption. A server whose minimum lease is longer
// grants its minimum instead (see the guide). Default DefaultTTL.
func WithTTL(d time.Duration) Option { return lock.WithTTL(d) }

// WithKeyPrefix puts every key under prefix; a '/' is appended if prefix does
// not end with one. Names never collide under one prefix, but prefixes must
// not nest ("app/" and "app/jobs/"): a name under the shorter one would
// cover the other's keys. Default DefaultKeyPrefix.
func WithKeyPrefix(prefix string) Option { return lock.WithKeyPrefix(prefix) }

// WithAutoRenew turns background renewal of the lease on or off. Unlike the
// family's general default, etcdlock renews by default everywhere, bare
// Acquire included: its locks ride on a lease shared by the factory that is
// kept alive like an etcd session. With WithAutoRenew(false) the lock gets a
// lease of its own (one more round trip to acquire) that only Extend renews.
func WithAutoRenew(on bool) Option { return lock.WithAutoRenew(on) }

// WithMaxHold ends a lock d after its Acquire: it is lost with
// ErrMaxHold and its key deleted; see lock.WithMaxHold.
func WithMaxHold(d time.Duration) Option { return lock.WithMaxHold(d) }

// WithShared takes the name shared, beside other shared holders; see
// lock.WithShared. Keys are served in revision order: a shared key waits
// for the exclusive keys created before it, an exclusive key for every
// key before it, so a reader that comes after a waiting writer waits
// behind it.
func WithShared() Option { return lock.WithShared() }

// WithOwner records who holds the lock, for Inspect and etcdctl.
func WithOwner(owner string) Option { return lock.WithOwner(owner) }

// WithMetadata adds a key/value pair stored with the lock, shown by Inspect.
func WithMetadata(key, value string) Option { return lock.WithMetadata(key, value) }

// WithLogger sets the logger; nil turns logging off. Default: slog.Default().
func WithLogger(l *slog.Logger) Option { return lock.WithLogger(l) }

// WithObserver sets the metrics and tracing hook.
func WithObserver(obs lock.Observer) Option { return lock.WithObserver(obs) }

// checkTTL rejects what an etcd lease cannot honour; zero means the default.
func checkTTL(d time.Duration) error {
	if d == 0 {
		return nil
	}
	if d < time.Second || d%time.Second != 0 || d > maxTTL {
		return fmt.Errorf("%w: WithTTL(%v): etcd leases are whole seconds, from 1s to %v", lock.ErrInvalidOption, d, maxTTL)
	}
	return nil
}

// maxTTL is the longest lease etcd grants (its MaxLeaseTTL).
const maxTTL = 9_000_000_000 * time.Second

func ttlOf(o *lock.Options) time.Duration {
	if o.TTL == 0 {
		return DefaultTTL
	}
	return o.TTL
}

func prefixOf(o *lock.Options) string {
	p := o.KeyPrefix
	if p == "" {
		return DefaultKeyPrefix
	}
	if !strings.HasSuffix(p, "/") {
		p += "/"
	}
	return p
}
