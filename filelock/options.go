//go:build unix

package filelock

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/ubgo/lock"
)

// Option configures the factory (defaults) or one call (overrides). The
// options mean the same in every backend of the family.
type Option = lock.Option

// DefaultStaleAfter is the lease of a marker when neither WithStaleAfter nor
// WithTTL is given: a holder that stops refreshing its marker (a hung or
// stopped process, or one on another host) loses the lock this long after
// its last refresh. Same-host holders that die are reclaimed at once,
// whatever the lease.
const DefaultStaleAfter = 30 * time.Second

// MinStaleAfter is the shortest lease accepted. Shorter ones would need
// refreshes faster than a file system can be trusted to serve them.
const MinStaleAfter = 100 * time.Millisecond

// DefaultDir returns the directory used without WithDir:
// filepath.Join(os.TempDir(), "ubgo-filelock").
func DefaultDir() string { return filepath.Join(os.TempDir(), "ubgo-filelock") }

// WithDir sets the directory that holds the marker and counter files. It is
// created (with its parents) on first use if missing. Every process that
// should contend for a name must use the same directory. Default:
// DefaultDir().
func WithDir(dir string) Option { return lock.WithDir(dir) }

// WithStaleAfter sets the lease of the marker: a holder that has not
// refreshed its marker for d is considered gone and any process may take
// the lock over. Holders refresh automatically (see WithAutoRenew); with
// WithAutoRenew(false) the caller must call Extend within d. The lease
// is written into the marker, so every process judges a marker by its
// holder's lease. It is WithTTL under the name the filelock docs use.
// Default DefaultStaleAfter; at least MinStaleAfter.
func WithStaleAfter(d time.Duration) Option { return lock.WithTTL(d) }

// WithTTL is WithStaleAfter under the family-wide name.
func WithTTL(d time.Duration) Option { return lock.WithTTL(d) }

// WithMaxConcurrent makes the name a semaphore of n permits, kept as slot
// markers <name>.0.lock … <name>.<n-1>.lock. Every holder of a name must use
// the same n; a different n gets an error matching lock.ErrLimitMismatch
// while any permit is held.
func WithMaxConcurrent(n int) Option { return lock.WithMaxConcurrent(n) }

// WithWait makes Acquire wait until a permit is free or its context ends.
// Waiters are woken by releases in the same process at once, by inotify for
// releases in other processes on the same host (Linux), and by polling for
// markers freed by crash, expiry or another host. Waiting is not FIFO.
func WithWait() Option { return lock.WithWait() }

// WithWaitTimeout makes Acquire wait for at most d; see lock.WithWaitTimeout.
func WithWaitTimeout(d time.Duration) Option { return lock.WithWaitTimeout(d) }

// WithAutoRenew(false) turns off the background refreshing of the marker
// (on by default, see lock.WithAutoRenew): the caller then refreshes it
// with Extend. Each held lock is refreshed on a timer of its own.
func WithAutoRenew(on bool) Option { return lock.WithAutoRenew(on) }

// WithMaxHold ends a lock d after its Acquire: refreshing stops, it is
// lost with ErrMaxHold and its marker removed; see lock.WithMaxHold.
func WithMaxHold(d time.Duration) Option { return lock.WithMaxHold(d) }

// WithShared takes the name in shared mode, beside other shared holders;
// see lock.WithShared. Each shared holder has a marker of its own in a
// reader slot <name>.<i>.lock, refreshed and reclaimed like a mutex
// marker. A writer that waits (WithWait) keeps an intent marker
// <name>.want while it waits, and new shared acquirers stay out while it
// is live.
func WithShared() Option { return lock.WithShared() }

// WithOwner records who holds the lock (a job or trace id) in the marker,
// where `cat` and Inspect show it.
func WithOwner(owner string) Option { return lock.WithOwner(owner) }

// WithMetadata adds a key/value pair to the marker, shown by `cat` and
// Inspect.
func WithMetadata(key, value string) Option { return lock.WithMetadata(key, value) }

// WithLogger sets the logger; nil turns logging off. Default: slog.Default().
func WithLogger(l *slog.Logger) Option { return lock.WithLogger(l) }

// WithObserver sets the metrics and tracing hook.
func WithObserver(obs lock.Observer) Option { return lock.WithObserver(obs) }

func validate(o *lock.Options) error {
	if o.TTL != 0 && o.TTL < MinStaleAfter {
		return fmt.Errorf("%w: stale window %v is below the minimum %v", lock.ErrInvalidOption, o.TTL, MinStaleAfter)
	}
	return nil
}

func ttlOf(o *lock.Options) time.Duration {
	if o.TTL == 0 {
		return DefaultStaleAfter
	}
	return o.TTL
}
