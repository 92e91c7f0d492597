package backend

import (
	"context"

	"github.com/ubgo/lock"
)

// WaitContext returns the context an Acquire takes its lock with: ctx,
// bounded by o.WaitTimeout when set (lock.WithWaitTimeout). Only the
// taking uses it; the holder does not depend on it.
func WaitContext(ctx context.Context, o *lock.Options) (context.Context, context.CancelFunc) {
	if o.WaitTimeout > 0 {
		return context.WithTimeout(ctx, o.WaitTimeout)
	}
	return ctx, func() {}
}
