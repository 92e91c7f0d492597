package backend

import (
	"context"
	"errors"
	"log/slog"

	"github.com/ubgo/lock"
)

// Log returns the logger o reports through, never nil.
func Log(o *lock.Options) *slog.Logger {
	if o.Logger != nil {
		return o.Logger
	}
	return slog.Default()
}

// Report logs e and hands it to o's observer. Backends call it once per
// operation; the outcome is derived from e.Err when left empty.
// Acquisitions, releases and extensions are logged at Debug, failures and
// losses at Warn, except a loss caused by the factory's Close (e.Err
// matches lock.ErrClosed), which the caller asked for: Debug.
func Report(ctx context.Context, o *lock.Options, e lock.Event) {
	if e.Outcome == "" {
		e.Outcome = lock.OutcomeOf(e.Err)
	}
	warn := e.Op == lock.OpLost || e.Outcome == lock.OutcomeError || e.Outcome == lock.OutcomeLost
	if e.Op == lock.OpLost && errors.Is(e.Err, lock.ErrClosed) {
		warn = false
	}
	report(ctx, o, e, warn)
}

// ReportRetried reports a failure the backend retries by itself, such as a
// background renewal: the observer sees it as it is, the log has it at
// Debug. If the retries do not save the lock, its loss is reported (at
// Warn), so one loss is one Warn line.
func ReportRetried(ctx context.Context, o *lock.Options, e lock.Event) {
	report(ctx, o, e, false)
}

func report(ctx context.Context, o *lock.Options, e lock.Event, warn bool) {
	if e.Outcome == "" {
		e.Outcome = lock.OutcomeOf(e.Err)
	}
	if e.Op == lock.OpLost && e.Reason == "" {
		e.Reason = lock.ReasonOf(e.Err)
	}
	if o.Observer != nil {
		o.Observer.Observe(ctx, e)
	}
	level := slog.LevelDebug
	if warn {
		level = slog.LevelWarn
	}
	log := Log(o)
	if !log.Enabled(ctx, level) {
		return
	}
	attrs := []slog.Attr{
		slog.String("backend", e.Backend),
		slog.String("name", e.Name),
		slog.String("outcome", string(e.Outcome)),
		slog.Duration("latency", e.Latency),
	}
	if e.Token != 0 {
		attrs = append(attrs, slog.Uint64("token", e.Token))
	}
	if e.Wait != 0 {
		attrs = append(attrs, slog.Duration("wait", e.Wait))
	}
	if e.Held != 0 {
		attrs = append(attrs, slog.Duration("held", e.Held))
	}
	if e.Reason != "" {
		attrs = append(attrs, slog.String("reason", string(e.Reason)))
	}
	if e.Err != nil {
		attrs = append(attrs, slog.Any("err", e.Err))
	}
	log.LogAttrs(ctx, level, "lock "+string(e.Op), attrs...)
}
