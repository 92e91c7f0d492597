package lock

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"
)

// A LeadOption configures [Lead].
type LeadOption func(*leadConfig)

type leadConfig struct {
	retry      time.Duration
	maxBackoff time.Duration
	log        *slog.Logger
	errs       []error
}

// The defaults of Lead's options (WithLeadRetry, WithLeadMaxBackoff).
const (
	DefaultLeadRetry      = time.Second
	DefaultLeadMaxBackoff = 30 * time.Second
)

// WithLeadRetry sets how long a follower waits between two campaigns, and
// how long a replica that stepped down waits before it campaigns again.
// Default DefaultLeadRetry. With the backend's loss detection it bounds how long a name
// stays leaderless after its leader dies. Each wait is jittered below d so
// that followers started together do not campaign in step (see
// https://github.com/ubgo/lock/blob/main/docs/design/patterns.md).
func WithLeadRetry(d time.Duration) LeadOption {
	return func(c *leadConfig) {
		if d <= 0 {
			c.errs = append(c.errs, fmt.Errorf("%w: WithLeadRetry(%v): must be positive", ErrInvalidOption, d))
			return
		}
		c.retry = d
	}
}

// WithLeadMaxBackoff caps the wait after failures (a backend error on
// Acquire, or work returning an error), which doubles from the retry
// interval on each failure in a row. Default DefaultLeadMaxBackoff; a cap below the retry
// interval is raised to it.
func WithLeadMaxBackoff(d time.Duration) LeadOption {
	return func(c *leadConfig) {
		if d <= 0 {
			c.errs = append(c.errs, fmt.Errorf("%w: WithLeadMaxBackoff(%v): must be positive", ErrInvalidOption, d))
			return
		}
		c.maxBackoff = d
	}
}

// WithLeadLogger sets the logger Lead reports elections, step-downs and
// failures to. Default slog.Default(); nil turns logging off.
func WithLeadLogger(l *slog.Logger) LeadOption {
	return func(c *leadConfig) {
		if l == nil {
			l = discard
		}
		c.log = l
	}
}

// Lead runs work whenever this replica is the leader of name, until ctx
// ends. It is leader election on any [Locker]:
//
//   - It campaigns by acquiring name. On [ErrLocked] it waits the retry
//     interval ([WithLeadRetry]) and tries again; a Locker built with
//     WithWait simply blocks in Acquire instead. Other errors are logged and
//     retried with a doubling backoff capped by [WithLeadMaxBackoff].
//   - Once elected it calls work with the holder's token as the epoch. The
//     context given to work is cancelled when the lock is lost (cause: the
//     holder's error, matching [ErrLockLost]) or when ctx ends.
//   - When work returns, for whatever reason, Lead releases the lock — only
//     then, so a successor never starts while work still runs — waits the
//     retry interval (the backoff if work failed) and campaigns again.
//
// Lead returns ctx.Err() once ctx ends, or at once an error that retrying
// cannot fix: an invalid name or option, a closed factory, a semaphore limit
// mismatch. A work error is logged, not returned; work that must stop every
// replica's campaign cancels ctx itself.
//
// When the leader dies, leadership moves within the backend's loss
// detection (the TTL of a lease, at once for a dead Postgres session or a
// killed flock holder) plus one retry interval.
//
// A leader whose lock was lost behind its back (a pause longer than the
// lease, a partition) keeps running until it notices, and its successor may
// already be working: Lead cancels work's context as soon as the backend
// reports the loss, but work must return promptly when it is cancelled, and
// every side effect a stale leader could still make must be fenced with the
// epoch ([Fence]). Hand Lead a Locker that leases with auto-renewal (the
// default of every factory's AsLocker), not one that would expire under a
// healthy leader.
//
// A Locker built with WithMaxConcurrent(n) elects n leaders.
func Lead(ctx context.Context, l Locker, name string, work func(ctx context.Context, epoch uint64) error, opts ...LeadOption) error {
	c := leadConfig{retry: DefaultLeadRetry, maxBackoff: DefaultLeadMaxBackoff, log: slog.Default()}
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	if l == nil || work == nil {
		c.errs = append(c.errs, fmt.Errorf("%w: Lead needs a Locker and a work function", ErrInvalidOption))
	}
	if len(c.errs) > 0 {
		return errors.Join(c.errs...)
	}
	if err := ValidateName(name); err != nil {
		return err
	}
	c.maxBackoff = max(c.maxBackoff, c.retry)
	log := c.log.With(slog.String("name", name))
	backoff := c.retry
	failed := func() time.Duration {
		d := backoff
		backoff = min(2*backoff, c.maxBackoff)
		return d
	}
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		var pause time.Duration
		h, err := l.Acquire(ctx, name)
		switch {
		case err == nil:
			if lead(ctx, h, work, log) {
				pause = failed()
			} else {
				backoff, pause = c.retry, c.retry
			}
		case ctx.Err() != nil:
			return ctx.Err()
		case errors.Is(err, ErrLocked):
			log.Debug("lock: not the leader", slog.Any("err", err))
			backoff, pause = c.retry, c.retry
		case permanent(err):
			log.Warn("lock: leader election stopped", slog.Any("err", err))
			return err
		default:
			pause = failed()
			log.Warn("lock: campaign failed", slog.Any("err", err), slog.Duration("retry_in", pause))
		}
		if !sleep(ctx, jitter(pause)) {
			return ctx.Err()
		}
	}
}

// lead runs one term of leadership and reports whether work failed on its
// own, rather than because leadership or ctx ended.
func lead(ctx context.Context, h Holder, work func(context.Context, uint64) error, log *slog.Logger) (failed bool) {
	epoch := h.Token()
	log = log.With(slog.Uint64("epoch", epoch))
	log.Info("lock: elected leader")
	wctx, stop := heldContext(ctx, h)
	defer func() {
		// Work has returned (or panicked): only now may a successor start.
		stop()
		lost := h.Err()
		rerr := h.Release()
		switch {
		case lost != nil:
			log.Warn("lock: leadership lost", slog.Any("err", lost))
		case rerr != nil:
			log.Warn("lock: stepped down; release failed", slog.Any("err", rerr))
		default:
			log.Info("lock: stepped down")
		}
	}()
	err := work(wctx, epoch)
	if err != nil && ctx.Err() == nil && h.Err() == nil {
		log.Warn("lock: leader work failed", slog.Any("err", err))
		return true
	}
	return false
}

// permanent reports whether err comes from input or state that another
// attempt will not change.
func permanent(err error) bool {
	for _, p := range []error{ErrInvalidName, ErrInvalidOption, ErrLimitMismatch, ErrClosed} {
		if errors.Is(err, p) {
			return true
		}
	}
	return false
}

func jitter(d time.Duration) time.Duration { return d - time.Duration(rand.Int64N(int64(d)/5+1)) }

// sleep waits d or until ctx ends, and reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// CurrentLeader reports who leads name, as in's backend sees it now: the
// holder with the highest token (its epoch), and false when nobody leads.
// Leaders are told apart by what they acquired with: give each replica's
// Locker WithOwner (a host name, a pod name) so HolderInfo.Owner says which
// replica it is. The answer is a snapshot and may be stale by the time it
// is read; decisions that must not act on a stale leader use the epoch.
func CurrentLeader(ctx context.Context, in Inspector, name string) (HolderInfo, bool, error) {
	if in == nil {
		return HolderInfo{}, false, fmt.Errorf("%w: CurrentLeader needs an Inspector", ErrInvalidOption)
	}
	info, err := in.Inspect(ctx, name)
	if err != nil || len(info.Holders) == 0 {
		return HolderInfo{}, false, err
	}
	best := info.Holders[0]
	for _, h := range info.Holders[1:] {
		if h.Token > best.Token {
			best = h
		}
	}
	return best, true, nil
}
