package gocronlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/contrib/gocronlock"
)

// gocron calls Lock synchronously with the job's context, which has no
// deadline, and schedules the job's next run only once Lock returns: a
// backend that does not answer (etcd down) must not hold the job for the
// whole outage. Every Lock is bounded, by default too.
func TestLockIsBounded(t *testing.T) {
	// stuck answers only when the Acquire context ends, as a backend that
	// gets no reply does; without a deadline it fails at once rather than
	// hang the test.
	stuck := func(got chan<- time.Duration) lock.Locker {
		return lock.LockerFunc(func(ctx context.Context, name string) (lock.Holder, error) {
			dl, ok := ctx.Deadline()
			if !ok {
				got <- -1
				return nil, errors.New("stuck: Acquire context has no deadline")
			}
			got <- time.Until(dl)
			<-ctx.Done()
			return nil, ctx.Err()
		})
	}
	t.Run("default", func(t *testing.T) {
		got := make(chan time.Duration, 1)
		l := gocronlock.New(lock.LockerFunc(func(ctx context.Context, name string) (lock.Holder, error) {
			dl, ok := ctx.Deadline()
			if !ok {
				got <- -1
			} else {
				got <- time.Until(dl)
			}
			return nil, errors.New("answered")
		}), gocronlock.WithLogger(nil))
		defer l.Close()
		l.Lock(context.Background(), "job")
		if d := <-got; d <= 0 || d > gocronlock.DefaultLockTimeout {
			t.Fatalf("Acquire context: deadline in %v (-1: none); want one within DefaultLockTimeout (%v)", d, gocronlock.DefaultLockTimeout)
		}
	})
	t.Run("WithLockTimeout", func(t *testing.T) {
		const bound = 50 * time.Millisecond
		got := make(chan time.Duration, 2)
		l := gocronlock.New(stuck(got), gocronlock.WithLockTimeout(bound), gocronlock.WithTickResolution(time.Second), gocronlock.WithLogger(nil))
		defer l.Close()
		jobCtx, cancel := context.WithCancel(context.Background()) // as gocron's: no deadline
		defer cancel()
		_, err := l.Lock(jobCtx, "job")
		if d := <-got; d <= 0 || d > bound {
			t.Fatalf("Acquire context: deadline in %v (-1: none); want one within %v", d, bound)
		}
		if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, lock.ErrLocked) {
			t.Fatalf("Lock on a backend that does not answer = %v; want DeadlineExceeded, not ErrLocked", err)
		}
		if jobCtx.Err() != nil {
			t.Fatal("the bound ended gocron's job context")
		}
	})
}
