package flock

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/backend"
)

// Option configures the factory (defaults) or one call (overrides). The
// options mean the same in every backend of the family. Shared options
// that flock has no use for (WithTTL, WithAutoRenew, WithKeyPrefix) are
// accepted and ignored, so code written against several backends can pass
// them; invalid values of them are still reported.
type Option = lock.Option

// DefaultDir is the directory used without WithDir:
// filepath.Join(os.TempDir(), "ubgo-lock"). Every user of a lock must be
// able to create and open files read-write there; services should pass a
// directory of their own (for example under /run) that /tmp cleaners leave
// alone.
func DefaultDir() string { return filepath.Join(os.TempDir(), "ubgo-lock") }

// WithDir sets the directory of the lock files, created with its parents
// on first use if missing. Default DefaultDir().
func WithDir(dir string) Option { return lock.WithDir(dir) }

// WithMaxConcurrent makes the name a semaphore of n permits, one slot file
// each (<name>.<i>.lock). Every holder of a name must use the same n, at
// most MaxPermits; a different n gets an error matching
// lock.ErrLimitMismatch. Without it the name is a mutex.
func WithMaxConcurrent(n int) Option { return lock.WithMaxConcurrent(n) }

// MaxPermits is the largest semaphore flock accepts: an Acquire may open
// one file per permit, and a waiter keeps them open.
const MaxPermits = 1024

func checkPermits(o *lock.Options) error {
	if o.MaxConcurrent > MaxPermits {
		return fmt.Errorf("flock: %w: WithMaxConcurrent(%d): at most %d", lock.ErrInvalidOption, o.MaxConcurrent, MaxPermits)
	}
	return nil
}

// WithWait makes Acquire wait until the lock is free or its context ends.
// Waiters are woken by releases in the same process at once, by releases
// in other processes through inotify on Linux, and otherwise by a poll
// (its intervals are in the guide). Without it a held lock fails at once
// with ErrLocked.
func WithWait() Option { return lock.WithWait() }

// WithWaitTimeout makes Acquire wait for at most d; see lock.WithWaitTimeout.
func WithWaitTimeout(d time.Duration) Option { return lock.WithWaitTimeout(d) }

// WithMaxHold ends a lock d after its Acquire: it is lost with
// ErrMaxHold and its files are closed, which frees it; see
// lock.WithMaxHold.
func WithMaxHold(d time.Duration) Option { return lock.WithMaxHold(d) }

// WithShared takes the name in shared mode (LOCK_SH), beside other
// shared holders; see lock.WithShared. A writer that waits holds the
// name's <esc>.want file exclusively, so new readers wait behind it.
func WithShared() Option { return lock.WithShared() }

// WithOwner records who holds the lock (a job or trace id) in the lock
// file, where Inspect and cat show it. Default: none, and Inspect reports
// pid@host.
func WithOwner(owner string) Option { return lock.WithOwner(owner) }

// WithMetadata adds a key/value pair written to the lock file and shown by
// Inspect.
func WithMetadata(key, value string) Option { return lock.WithMetadata(key, value) }

// WithLogger sets the logger; nil turns logging off. Default:
// slog.Default().
func WithLogger(l *slog.Logger) Option { return lock.WithLogger(l) }

// WithObserver sets the metrics and tracing hook.
func WithObserver(obs lock.Observer) Option { return lock.WithObserver(obs) }

type sweepKey struct{}

// WithSweepAfter turns automatic sweeps on: Acquire then starts a sweep of
// the directory in the background at most once per d per process and
// directory, removing the files of every name that is free and was last
// acquired more than d ago (see Factory.Sweep for the protocol). Without
// it files stay until Factory.Sweep removes them. A swept name's
// counter is gone; the directory's fence file keeps its next token above
// the last one.
func WithSweepAfter(d time.Duration) Option { return duration("WithSweepAfter", sweepKey{}, d) }

type checkKey struct{}

// DefaultCheckInterval is how often held locks verify their files.
const DefaultCheckInterval = time.Second

// WithCheckInterval sets how often the factory verifies that each lock it
// holds is still the file at its path. The kernel never takes a flock
// away, but a file deleted or replaced behind the library's back (rm, a
// /tmp cleaner) lets another process lock a new file at the same path; a
// holder whose file is gone is reported lost (Done closes, Err matches
// ErrLockLost) within one interval. 0 turns the check off. Default
// DefaultCheckInterval. It is a factory option: per-call values are
// ignored.
func WithCheckInterval(d time.Duration) Option { return duration("WithCheckInterval", checkKey{}, d) }

func sweepAfter(o *lock.Options) time.Duration {
	d, _ := o.Value(sweepKey{}).(time.Duration)
	return d
}

func checkInterval(o *lock.Options) time.Duration {
	if d, ok := o.Value(checkKey{}).(time.Duration); ok {
		return d
	}
	return DefaultCheckInterval
}

// duration is the option named what that stores d under key, or reports it
// invalid if it is negative.
func duration(what string, key any, d time.Duration) Option {
	if d < 0 {
		return func(o *lock.Options) { o.Invalid(what + "(" + d.String() + "): must not be negative") }
	}
	return backend.Value(backendName, what, key, d)
}
