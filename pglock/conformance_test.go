package pglock_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/locktest"
	"github.com/ubgo/lock/pglock"
)

func TestConformance(t *testing.T) {
	pool := newPool(t)
	runConformance(t, pool, pool, true)
}

// TestConformanceNoWaitSessions runs the suite with every waiter retrying
// on notifications (WithWaitSessions(0)): writers that wait so keep
// readers out by the intent key, not by Postgres's queue, and are not
// served in order.
func TestConformanceNoWaitSessions(t *testing.T) {
	pool := newPool(t)
	runConformance(t, pool, pool, false, pglock.WithWaitSessions(0))
}

// runConformance runs the suite on factories of pool with opts; direct
// reaches the same server without a pooler in between (to end a holder's
// backend, to see Postgres's queue). fifo: waiting writers block in
// Postgres's queue of the key, which serves them in order.
func runConformance(t *testing.T, pool, direct *pgxpool.Pool, fifo bool, opts ...pglock.Option) {
	// Lockers from three factories: two New calls contend through
	// Postgres when they land on different factories and through the
	// in-process table when they land on the same one.
	var fs []*pglock.Factory
	for i := 0; i < 3; i++ {
		f := pglock.NewFactory(pool, append([]pglock.Option{pglock.WithLogger(nil), pglock.WithHealthInterval(200 * time.Millisecond), pglock.WithPollInterval(200 * time.Millisecond)}, opts...)...)
		t.Cleanup(func() { f.Close() })
		fs = append(fs, f)
	}
	var n atomic.Int32
	b := locktest.Backend{
		New: func(t testing.TB, opts ...lock.Option) lock.Locker {
			return fs[int(n.Add(1))%len(fs)].AsLocker(opts...)
		},
		ErrLocked:   pglock.ErrLocked,
		ErrLockLost: pglock.ErrLockLost,
		Wait:        true,
		Semaphore:   true,
		Shared:      true,
		Inspector:   func(testing.TB) lock.Inspector { return fs[0] },
		Lister:      func(testing.TB) lock.Lister { return fs[1] },
		// Plain holders write no row that List could find.
		ListOwnedOnly: true,
		Dial: func(t testing.TB, addr string, opts ...lock.Option) lock.Locker {
			pool, err := pgxpool.New(context.Background(), "postgres://postgres@"+addr+"/test?sslmode=disable")
			if err != nil {
				t.Fatal(err)
			}
			f := pglock.NewFactory(pool, pglock.WithLogger(nil))
			t.Cleanup(func() { f.Close(); pool.Close() })
			return f.AsLocker(opts...)
		},
		Lose: func(t testing.TB, h lock.Holder) {
			terminate(t, direct, h.(*pglock.Holder).BackendPID())
		},
		Waiting: func(name string) int {
			n := 0
			for _, f := range fs {
				n += f.Waiting(name)
			}
			return n
		},
		NewFactory: func(t testing.TB, opts ...lock.Option) locktest.Factory {
			f := pglock.NewFactory(pool, append([]lock.Option{pglock.WithLogger(nil)}, opts...)...)
			t.Cleanup(func() { f.Close() })
			return f
		},
		Name: "pglock",
	}
	if fifo {
		// Postgres serves its queue in order, and a factory its own
		// waiters: each waiter on a factory of its own, as a process.
		b.FIFO = func(t testing.TB, lopts ...lock.Option) lock.Locker {
			f := pglock.NewFactory(pool, append([]pglock.Option{pglock.WithLogger(nil)}, opts...)...)
			t.Cleanup(func() { f.Close() })
			return f.AsLocker(lopts...)
		}
		b.Queued = func(name string) int {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			var n int
			if err := direct.QueryRow(ctx, `SELECT count(*) FROM (`+waiterPIDs+`) w`, name).Scan(&n); err != nil {
				return 0
			}
			return n
		}
	}
	locktest.Run(t, b)
}
