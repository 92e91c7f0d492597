package pglock

import (
	"fmt"
	"log/slog"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/backend"
)

// Option configures the factory (defaults) or one call (overrides). The
// shared options mean the same in every backend of the family; the options
// marked "factory option" below are read once by NewFactory and ignored
// when passed to a single call.
type Option = lock.Option

// Defaults and limits of the factory options.
const (
	// DefaultSchema holds pglock's tables, sequence and functions when
	// WithSchema is not given.
	DefaultSchema = "public"
	// DefaultSessions is the number of lock sessions (connections held
	// by the factory) when WithSessions is not given; MaxSessions is the
	// most it accepts.
	DefaultSessions = 2
	MaxSessions     = 64
	// DefaultWaitSessions is the number of wait sessions (connections a
	// waiting Acquire blocks on, see WithWaitSessions) when
	// WithWaitSessions is not given.
	DefaultWaitSessions = 4
	// DefaultHealthInterval is how often an idle lock session is checked
	// when WithHealthInterval is not given: about how long an ended
	// session takes to be noticed.
	DefaultHealthInterval = time.Second
	// DefaultStatementTimeout bounds each use of a lock session when
	// WithStatementTimeout is not given.
	DefaultStatementTimeout = 5 * time.Second
	// DefaultPollInterval is how often a waiting Acquire retries without
	// a release notification when WithPollInterval is not given.
	DefaultPollInterval = time.Second
	// DefaultConnectTimeout bounds the wait for a pool connection when
	// WithConnectTimeout is not given.
	DefaultConnectTimeout = 5 * time.Second
)

// WithMaxConcurrent makes the name a semaphore of n permits (at most
// MaxPermits), each an advisory lock of its own with its own token. The
// limit is stored in the pglock_limits table; a caller that passes a different limit while the
// name has holders gets an error matching lock.ErrLimitMismatch.
func WithMaxConcurrent(n int) Option { return lock.WithMaxConcurrent(n) }

// WithWait makes Acquire wait until a permit is free or ctx ends. The
// first waiter of a mutex or of a shared name in a factory blocks in
// Postgres on a wait session (see WithWaitSessions), which Postgres wakes,
// first come first (readers queued together, together), at a release;
// others of the factory queue behind it. Semaphore waiters,
// and waiters beyond the wait sessions, are woken by a NOTIFY sent by the
// release, with a fallback poll (see WithPollInterval) for locks freed by
// a session that ended.
func WithWait() Option { return lock.WithWait() }

// WithWaitTimeout makes Acquire wait for at most d; see lock.WithWaitTimeout.
func WithWaitTimeout(d time.Duration) Option { return lock.WithWaitTimeout(d) }

// WithKeyPrefix is the namespace of the advisory keys: the same name under
// two prefixes is two different locks. Without it names have no prefix. It
// must be UTF-8 without NUL.
func WithKeyPrefix(prefix string) Option { return lock.WithKeyPrefix(prefix) }

// WithMaxHold ends a lock d after its Acquire: it is lost with
// ErrMaxHold and unlocked on its session; see lock.WithMaxHold.
func WithMaxHold(d time.Duration) Option { return lock.WithMaxHold(d) }

// WithShared takes the name shared (pg_try_advisory_lock_shared; waiting,
// pg_advisory_lock_shared), beside other shared holders; see
// lock.WithShared. A writer that waits blocks in Postgres's queue of the
// key, which turns later shared tries away and queues later shared waits
// behind it, or, without a free wait session, holds the name's intent key,
// which they check.
func WithShared() Option { return lock.WithShared() }

// WithOwner records who holds the lock (a job or trace id), shown by
// Inspect. A call with an owner or metadata writes its holder, with its
// token, to the pglock_holders table in the acquire statement.
func WithOwner(owner string) Option { return lock.WithOwner(owner) }

// WithMetadata adds a key/value pair shown by Inspect and stored with the
// holder in the pglock_holders table (see WithOwner).
func WithMetadata(key, value string) Option { return lock.WithMetadata(key, value) }

// WithLogger sets the logger; nil turns logging off. Default: slog.Default().
func WithLogger(l *slog.Logger) Option { return lock.WithLogger(l) }

// WithObserver sets the metrics and tracing hook.
func WithObserver(obs lock.Observer) Option { return lock.WithObserver(obs) }

type (
	schemaKey         struct{}
	sessionsKey       struct{}
	waitSessionsKey   struct{}
	healthKey         struct{}
	stmtTimeoutKey    struct{}
	pollKey           struct{}
	connectTimeoutKey struct{}
	appNameKey        struct{}
)

// WithSchema names the schema that holds pglock's table, sequence and
// functions (created on first use); default DefaultSchema. Factory option.
func WithSchema(schema string) Option {
	if schema == "" {
		return func(o *lock.Options) { o.Invalid(`pglock.WithSchema(""): empty schema`) }
	}
	return backend.Value(backendName, "WithSchema", schemaKey{}, schema)
}

// WithSessions sets how many dedicated lock sessions (database
// connections) the factory keeps: every lock it hands out is held on one of
// them, chosen by the name's key. Postgres makes every statement on a
// session slower the more locks it holds (it walks them at each
// transaction end), so a process that holds thousands of locks at once
// trades connections for latency here. Default DefaultSessions, at most
// MaxSessions. Factory option.
func WithSessions(n int) Option {
	if n < 1 || n > MaxSessions {
		return func(o *lock.Options) { o.Invalid(fmt.Sprintf("pglock.WithSessions(%d): need 1 to %d", n, MaxSessions)) }
	}
	return backend.Value(backendName, "WithSessions", sessionsKey{}, n)
}

// WithWaitSessions sets how many wait sessions the factory may open: the
// first waiter of a mutex (or a shared name) in this factory blocks in
// Postgres on one of its own, so that a release wakes exactly the longest
// waiting session (or the readers queued together), and then holds the
// lock on it until it is released. Each is a connection
// taken from the pool (only while the pool has one to spare) and closed
// after a while unused (see the guide). Waiters beyond them, and semaphore
// waiters, retry when a release is notified. 0 turns blocking off. Default
// DefaultWaitSessions, at most MaxSessions. Factory option.
func WithWaitSessions(n int) Option {
	if n < 0 || n > MaxSessions {
		return func(o *lock.Options) {
			o.Invalid(fmt.Sprintf("pglock.WithWaitSessions(%d): need 0 to %d", n, MaxSessions))
		}
	}
	return backend.Value(backendName, "WithWaitSessions", waitSessionsKey{}, n)
}

// WithHealthInterval sets how often an idle lock session is checked with a
// query. A session that ended is noticed within this interval (plus the
// statement timeout when the network is cut), and its holders lose their
// locks. Default DefaultHealthInterval. Factory option.
func WithHealthInterval(d time.Duration) Option {
	return duration("WithHealthInterval", healthKey{}, d)
}

// WithStatementTimeout bounds each use of a lock session: one statement,
// or the few of a rare slow path. A session that runs out is in an unknown
// state, so it is closed and its holders lose their locks. Default
// DefaultStatementTimeout. Factory option.
func WithStatementTimeout(d time.Duration) Option {
	return duration("WithStatementTimeout", stmtTimeoutKey{}, d)
}

// WithPollInterval sets how often a waiting Acquire retries when no release
// notification arrives, which catches locks freed by a session that ended.
// Default DefaultPollInterval. Factory option.
func WithPollInterval(d time.Duration) Option { return duration("WithPollInterval", pollKey{}, d) }

// WithConnectTimeout bounds the wait for a pool connection when the factory
// opens a lock session or its listener, so an exhausted pool gives
// ErrPoolExhausted, and a server that does not answer an error saying so,
// instead of a hang. Default DefaultConnectTimeout. Factory option.
func WithConnectTimeout(d time.Duration) Option {
	return duration("WithConnectTimeout", connectTimeoutKey{}, d)
}

// WithApplicationName sets the application_name of the factory's lock
// sessions and listener, which is how operators find them in
// pg_stat_activity. Default: the pool's application_name followed by
// "/pglock", or "pglock" when the pool sets none. Factory option.
func WithApplicationName(name string) Option {
	return backend.Value(backendName, "WithApplicationName", appNameKey{}, name)
}

func duration(what string, key any, d time.Duration) Option {
	if d <= 0 {
		return func(o *lock.Options) { o.Invalid(fmt.Sprintf("%s(%v): must be positive", what, d)) }
	}
	return backend.Value(backendName, what, key, d)
}

// settings are the factory-level part of the options.
type settings struct {
	schema         string
	sessions       int
	waitSessions   int
	health         time.Duration
	stmtTimeout    time.Duration
	poll           time.Duration
	connectTimeout time.Duration
	appName        string
	idleClose      time.Duration // an unused lock session is closed after this
}

func factorySettings(o *lock.Options) settings {
	c := settings{
		schema: DefaultSchema, sessions: DefaultSessions, waitSessions: DefaultWaitSessions, health: DefaultHealthInterval,
		stmtTimeout: DefaultStatementTimeout, poll: DefaultPollInterval,
		connectTimeout: DefaultConnectTimeout, idleClose: time.Minute,
	}
	if v, ok := o.Value(schemaKey{}).(string); ok {
		c.schema = v
	}
	if v, ok := o.Value(sessionsKey{}).(int); ok {
		c.sessions = v
	}
	if v, ok := o.Value(waitSessionsKey{}).(int); ok {
		c.waitSessions = v
	}
	if v, ok := o.Value(healthKey{}).(time.Duration); ok {
		c.health = v
	}
	if v, ok := o.Value(stmtTimeoutKey{}).(time.Duration); ok {
		c.stmtTimeout = v
	}
	if v, ok := o.Value(pollKey{}).(time.Duration); ok {
		c.poll = v
	}
	if v, ok := o.Value(connectTimeoutKey{}).(time.Duration); ok {
		c.connectTimeout = v
	}
	if v, ok := o.Value(appNameKey{}).(string); ok {
		c.appName = v
	}
	return c
}

// MaxPermits is the largest WithMaxConcurrent pglock accepts: an acquire
// may try every permit key, and a limit change takes them all at once.
const MaxPermits = 1024

// checkCall validates what the root does not: a prefix is hashed with NUL
// separators, so it must not contain NUL itself; the permits are bounded.
func checkCall(o *lock.Options) error {
	if strings.IndexByte(o.KeyPrefix, 0) >= 0 || !utf8.ValidString(o.KeyPrefix) {
		return fmt.Errorf("%w: pglock.WithKeyPrefix: must be UTF-8 without NUL (it is stored as text)", lock.ErrInvalidOption)
	}
	if o.MaxConcurrent > MaxPermits {
		return fmt.Errorf("%w: WithMaxConcurrent(%d): pglock allows at most %d", lock.ErrInvalidOption, o.MaxConcurrent, MaxPermits)
	}
	return nil
}
