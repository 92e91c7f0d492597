package lock

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// A Ledger records durably which keys' work has completed. [RunOnce] uses it
// for what a lock alone cannot do: a lock keeps two replicas from running
// the same work at the same time, but a replica that starts after the first
// one finished and released finds the lock free, and would run it again.
//
// IsDone reports whether key was recorded. MarkDone records key as done by
// the holder of token, atomically and idempotently: the first record wins,
// and recording a key already recorded changes nothing and returns nil.
// Both fail only when the store does; a false from IsDone must mean "not
// recorded", never "could not tell". (IsDone, not Done: a Holder's Done is
// the channel of its end.)
//
// Each method is one atomic operation in a durable store, for example in
// Postgres:
//
//	SELECT EXISTS (SELECT 1 FROM lock_ledger WHERE key = $1)
//	INSERT INTO lock_ledger (key, token, done_at) VALUES ($1, $2, now())
//	ON CONFLICT (key) DO NOTHING
//
// and in Redis EXISTS and SET key token NX (with PX for keys of periods
// that may be forgotten). An operator re-runs a key by deleting its record.
type Ledger interface {
	IsDone(ctx context.Context, key string) (bool, error)
	MarkDone(ctx context.Context, key string, token uint64) error
}

// MemoryLedger is a [Ledger] kept in this process's memory: the one for
// tests, and for work that must run once per process. The zero value is not
// usable; call [NewMemoryLedger].
type MemoryLedger struct {
	mu   sync.Mutex
	done map[string]uint64
}

// NewMemoryLedger returns an empty ledger.
func NewMemoryLedger() *MemoryLedger { return &MemoryLedger{done: map[string]uint64{}} }

// IsDone reports whether key was recorded.
func (l *MemoryLedger) IsDone(ctx context.Context, key string) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	_, ok := l.done[key]
	return ok, nil
}

// MarkDone records key as done by token, unless it already was.
func (l *MemoryLedger) MarkDone(ctx context.Context, key string, token uint64) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.done[key]; !ok {
		l.done[key] = token
	}
	return nil
}

// DoneBy returns the token recorded for key, and false if key is not done.
func (l *MemoryLedger) DoneBy(key string) (uint64, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	token, ok := l.done[key]
	return token, ok
}

// Forget removes key's record, so its work may run again.
func (l *MemoryLedger) Forget(key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.done, key)
}

// recordTimeout bounds MarkDone after fn succeeded. It runs without the
// caller's cancellation: work that completed must be recorded even when the
// caller is shutting down, or a replica would run it again.
const recordTimeout = 10 * time.Second

// RunOnce runs fn for key once ever across every replica that shares l and
// led, and reports whether this call ran it. key names both the lock and the
// ledger record.
//
// It checks the ledger, acquires key, checks the ledger again under the lock
// (another replica may have finished in between), runs fn with a context
// that is cancelled when the lock is lost, records completion with the
// holder's token, and releases. A key already recorded returns (false, nil)
// without touching the lock.
//
// Contention returns the Acquire error (matching [ErrLocked]): another
// replica is running fn right now, and may yet fail. Callers that must not
// go on before the work is done (schema migrations at start-up) pass a
// Locker built with WithWait: they queue behind the runner and then find the
// key recorded.
//
// An fn error is returned with ran true and nothing recorded, so a later
// call tries again. A lock lost while fn ran is reported like [WithLock]
// does, joined to the result, after the completion is recorded (fn did
// complete).
//
// Exactly once holds for runs that complete and are recorded. A replica that
// dies after fn's effects but before MarkDone leaves the key unrecorded, and
// the next replica runs fn again; so fn must be idempotent, or record its
// completion in the same transaction as its effects (the migration tool's
// own version table) and check it first.
func RunOnce(ctx context.Context, l Locker, led Ledger, key string, fn func(ctx context.Context) error) (ran bool, err error) {
	if l == nil || led == nil || fn == nil {
		return false, fmt.Errorf("%w: RunOnce needs a Locker, a Ledger and a function", ErrInvalidOption)
	}
	if err := ValidateName(key); err != nil {
		return false, err
	}
	if done, err := led.IsDone(ctx, key); err != nil || done {
		return false, ledgerError(err)
	}
	h, err := l.Acquire(ctx, key)
	if err != nil {
		return false, err
	}
	defer releaseInto(h, &err)
	if done, err := led.IsDone(ctx, key); err != nil || done {
		return false, ledgerError(err)
	}
	hctx, stop := heldContext(ctx, h)
	defer stop()
	if err := fn(hctx); err != nil {
		return true, err
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), recordTimeout)
	defer cancel()
	if err := led.MarkDone(rctx, key, h.Token()); err != nil {
		return true, fmt.Errorf("lock: %q ran but its completion was not recorded: %w", key, err)
	}
	return true, nil
}

func ledgerError(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("lock: ledger: %w", err)
}

// PeriodKey names the period of length period that contains t:
// name + "@" + the period's start in UTC, RFC 3339 ("backup@2026-05-04T00:00:00Z"
// for a day). Periods are counted from the zero time.Time, so a period that
// divides a day starts at UTC midnight, and a 7-day period on a Monday.
// Months are not durations: build such keys with t.Format("2006-01").
// A period ≤ 0 names the instant t.
func PeriodKey(name string, t time.Time, period time.Duration) string {
	return name + "@" + t.UTC().Truncate(period).Format(time.RFC3339Nano)
}

// RunOncePer runs fn at most once per period across replicas: [RunOnce] with
// the key [PeriodKey](name, at, period). Pass as at the time the run was
// scheduled for (the cron tick), not time.Now(): replicas whose clocks or
// schedulers drift around a period boundary then still agree on the key.
func RunOncePer(ctx context.Context, l Locker, led Ledger, name string, period time.Duration, at time.Time, fn func(ctx context.Context) error) (bool, error) {
	if period <= 0 {
		return false, fmt.Errorf("%w: RunOncePer period %v: must be positive", ErrInvalidOption, period)
	}
	return RunOnce(ctx, l, led, PeriodKey(name, at, period), fn)
}

// HoldAtLeast runs fn under name, like [WithLock], but keeps the lock until
// at least hold has passed since it was acquired, even if fn finished
// sooner. A replica whose timer for the same tick fires up to hold later
// then still finds the lock taken, where a lock released at once would let
// it run the tick again.
//
// It needs no ledger, and is right for frequent ticks where a rare repeat is
// harmless (a cache refresh every minute: hold 30s). It is not exactly once:
// a replica that fires later than hold, a holder that crashes (lease
// backends keep its lock until the TTL, session backends free it at once),
// or a ctx that ends during the hold — the hold is cut short so shutdown is
// not delayed — all let the tick run again. Use [RunOncePer] when a second
// run would do harm (a backup, billing).
func HoldAtLeast(ctx context.Context, l Locker, name string, hold time.Duration, fn func(ctx context.Context) error) (err error) {
	if l == nil || fn == nil {
		return fmt.Errorf("%w: HoldAtLeast needs a Locker and a function", ErrInvalidOption)
	}
	h, err := l.Acquire(ctx, name)
	if err != nil {
		return err
	}
	start := time.Now()
	defer releaseInto(h, &err)
	hctx, stop := heldContext(ctx, h)
	defer stop()
	err = fn(hctx)
	if rest := hold - time.Since(start); rest > 0 {
		t := time.NewTimer(rest)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
		case <-h.Done():
		}
	}
	return err
}
