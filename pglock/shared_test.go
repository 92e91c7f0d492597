package pglock_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/internal/testenv"
	"github.com/ubgo/lock/pglock"
)

// A shared holder whose session is killed loses its share, and a writer
// waiting behind it gets the lock; in both wait modes (blocked in
// Postgres, and retrying on notifications with the intent key held).
func TestKilledSharedHolder(t *testing.T) {
	for _, ws := range []int{pglock.DefaultWaitSessions, 0} {
		t.Run(fmt.Sprint("WaitSessions", ws), func(t *testing.T) {
			pool := newPool(t)
			readers := pglock.NewFactory(pool, pglock.WithLogger(nil), pglock.WithHealthInterval(100*time.Millisecond))
			writers := pglock.NewFactory(pool, pglock.WithLogger(nil), pglock.WithWaitSessions(ws), pglock.WithPollInterval(100*time.Millisecond))
			t.Cleanup(func() { readers.Close(); writers.Close() })
			name := fmt.Sprintf("shared-killed/%d/%d", ws, time.Now().UnixNano())

			r, err := readers.Acquire(ctxT(t), name, pglock.WithShared())
			if err != nil {
				t.Fatal(err)
			}
			got := make(chan error, 1)
			var wt uint64
			go func() {
				h, err := writers.Acquire(ctxT(t), name, pglock.WithWait())
				if err == nil {
					wt = h.Token()
					err = h.Release()
				}
				got <- err
			}()
			testenv.Eventually(t, 30*time.Second, "the writer waiting", func() bool { return writers.Waiting(name) > 0 })
			terminate(t, pool, r.BackendPID())
			select {
			case <-r.Done():
			case <-time.After(30 * time.Second):
				t.Fatal("the killed reader's Done not closed in 30s")
			}
			if !errors.Is(r.Err(), lock.ErrLockLost) {
				t.Fatalf("killed reader's Err = %v; want ErrLockLost", r.Err())
			}
			if err := <-got; err != nil {
				t.Fatalf("writer waiting behind the killed reader: %v", err)
			}
			if wt <= r.Token() {
				t.Fatalf("writer's token %d not above the reader's %d", wt, r.Token())
			}
		})
	}
}

// Inspect shows a name held shared: one holder per session, with its
// newest reader's row.
func TestInspectShared(t *testing.T) {
	pool := newPool(t)
	a := pglock.NewFactory(pool, pglock.WithLogger(nil))
	b := pglock.NewFactory(pool, pglock.WithLogger(nil))
	t.Cleanup(func() { a.Close(); b.Close() })
	name := fmt.Sprintf("shared-inspect/%d", time.Now().UnixNano())
	ra, err := a.Acquire(ctxT(t), name, pglock.WithShared(), pglock.WithOwner("a"))
	if err != nil {
		t.Fatal(err)
	}
	rb, err := b.Acquire(ctxT(t), name, pglock.WithShared(), pglock.WithOwner("b"))
	if err != nil {
		t.Fatal(err)
	}
	info, err := a.Inspect(ctxT(t), name)
	if err != nil || len(info.Holders) != 2 || info.Holders[0].Owner != "a" || info.Holders[1].Owner != "b" || info.Holders[1].Token != rb.Token() {
		t.Fatalf("Inspect = %+v, %v; want the two readers", info, err)
	}
	ra.Release()
	rb.Release()
	if info, err := a.Inspect(ctxT(t), name); err != nil || len(info.Holders) != 0 {
		t.Fatalf("Inspect after release = %+v, %v", info, err)
	}
}
