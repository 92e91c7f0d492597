package redislock

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/backend"
)

// Option configures the factory (defaults) or one call (overrides). The
// options mean the same in every backend of the family.
type Option = lock.Option

// Defaults and limits.
const (
	// DefaultTTL is the lease length when WithTTL is not given: how long
	// a crashed holder keeps a name before Redis frees it.
	DefaultTTL = 30 * time.Second
	// MinTTL is the shortest lease accepted. Below it the safety margin
	// (see WithTTL) is too thin to matter even on loopback; a lease should
	// in practice be many round trips long.
	MinTTL = 10 * time.Millisecond
	// DefaultKeyPrefix is put in front of every key when WithKeyPrefix is
	// not given.
	DefaultKeyPrefix = "lock:"
)

// WithMaxConcurrent makes the name a semaphore of n permits (a sorted set
// of permits in Redis). Every holder of a name must use the same n; the
// limit is stored beside the permits and a different n gets an error
// matching lock.ErrLimitMismatch. Without it the name is a mutex (a plain
// string key).
func WithMaxConcurrent(n int) Option { return lock.WithMaxConcurrent(n) }

// WithWait makes Acquire wait until the lock is free or ctx ends, instead
// of failing at once with ErrLocked. A waiter is woken by the release's
// pub/sub notification, and retries when the current lease would run out
// in case its holder dies without releasing.
func WithWait() Option { return lock.WithWait() }

// WithWaitTimeout makes Acquire wait for at most d; see lock.WithWaitTimeout.
func WithWaitTimeout(d time.Duration) Option { return lock.WithWaitTimeout(d) }

// WithTTL sets the lease length (default DefaultTTL, at least MinTTL).
// Redis frees a lock whose holder neither released nor extended it within
// d. The holder itself considers the lock lost a safety margin earlier,
// counted from when it sent its last confirmed acquire or extend, so that
// it stops before Redis can hand the name to someone else; the margin is
// in the guide's "Loss" section.
func WithTTL(d time.Duration) Option { return lock.WithTTL(d) }

// WithKeyPrefix puts every key and channel under prefix, used verbatim
// (default DefaultKeyPrefix; an empty prefix means the default).
// A name's keys are <prefix>{<escaped name>}:lock, :token, :permits,
// :queue and :took:<id>, and its channel <prefix>{<escaped name>}:released
// (the guide lists them). A prefix
// with a hash tag of its own ("{app}:") puts every lock in that tag's
// cluster slot; one whose first '{' is followed by '}' is refused.
func WithKeyPrefix(prefix string) Option { return lock.WithKeyPrefix(prefix) }

// WithAutoRenew(false) turns off the renewal of leases in the background
// (on by default, see lock.WithAutoRenew: a few times per TTL, from one
// renewal loop per factory, as the guide's "Loss" section says); the
// caller then renews with Extend.
func WithAutoRenew(on bool) Option { return lock.WithAutoRenew(on) }

// WithMaxHold ends a lock d after its Acquire: renewal stops, it is lost
// with ErrMaxHold and its key removed; see lock.WithMaxHold.
func WithMaxHold(d time.Duration) Option { return lock.WithMaxHold(d) }

// WithShared takes the name shared, beside other shared holders; see
// lock.WithShared. The readers are kept like a semaphore's permits (a
// sorted set scored by expiry); a writer that waits for them sets the
// lock key, which turns new readers away (writer preference), and the
// last reader's release hands the name to it.
func WithShared() Option { return lock.WithShared() }

// WithOwner records who holds the lock (a job or trace id), stored with
// the lock and shown by Inspect. Without it the owner is the process id
// and host name.
func WithOwner(owner string) Option { return lock.WithOwner(owner) }

// WithMetadata adds a key/value pair stored with the lock and shown by
// Inspect.
func WithMetadata(key, value string) Option { return lock.WithMetadata(key, value) }

// WithLogger sets the logger; nil turns logging off. Without it the
// factory logs to slog.Default().
func WithLogger(l *slog.Logger) Option { return lock.WithLogger(l) }

// WithObserver sets the metrics and tracing hook.
func WithObserver(obs lock.Observer) Option { return lock.WithObserver(obs) }

func checkTTL(d time.Duration) error {
	if d != 0 && d < MinTTL {
		return fmt.Errorf("%w: WithTTL(%v) is below the minimum of %v", lock.ErrInvalidOption, d, MinTTL)
	}
	return nil
}

func checkOptions(o *lock.Options) error {
	if err := checkTTL(o.TTL); err != nil {
		return err
	}
	return checkPrefix(o.KeyPrefix)
}

// checkPrefix refuses a prefix whose first '{' is followed at once by '}':
// Redis Cluster hashes such a key whole, not by the name's tag after it,
// so the keys of one name would fall in different slots (CROSSSLOT).
func checkPrefix(prefix string) error {
	if i := strings.IndexByte(prefix, '{'); i >= 0 && strings.HasPrefix(prefix[i:], "{}") {
		return fmt.Errorf("%w: WithKeyPrefix(%q): an empty hash tag {} first in the key would spread a name's keys over cluster slots", lock.ErrInvalidOption, prefix)
	}
	return nil
}

// ErrNotReplicated: fewer replicas than WithReplicaAck asks for
// acknowledged a lock's write in time. An Acquire that gets it has
// released what it took; a renewal that gets it is retried, and the
// holder's deadline decides.
var ErrNotReplicated = errors.New("redislock: lock not acknowledged by enough replicas")

type replicaAckKey struct{}

// WithReplicaAck makes every write that takes or renews a lock wait until n
// replicas of its primary acknowledged it (Redis WAIT, on the same
// connection, for a bounded time that the guide's Options section gives),
// and count only then: an Acquire returns once the lock
// is on n replicas, and a holder's deadline moves only with renewals that
// reached them. This narrows the window in which a failover to a replica
// that missed the lock admits a second holder; it does not close it (a
// replica can acknowledge and still not be the one promoted; Redis
// replication stays asynchronous). An Acquire costs one more round trip.
// Needs a *redis.Client (a primary, or a Sentinel failover client) or a
// *redis.ClusterClient. Factory option.
func WithReplicaAck(n int) Option {
	if n < 1 {
		return func(o *lock.Options) { o.Invalid(fmt.Sprintf("redislock.WithReplicaAck(%d): need at least 1", n)) }
	}
	return backend.Value(backendName, "WithReplicaAck", replicaAckKey{}, n)
}

// replicaAck is the factory's WithReplicaAck, 0 if not given.
func (f *Factory) replicaAck() int {
	n, _ := f.cfg.Options.Value(replicaAckKey{}).(int)
	return n
}
