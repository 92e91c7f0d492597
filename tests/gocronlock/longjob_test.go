package gocronlock_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/go-co-op/gocron/v2"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/contrib/gocronlock"
)

// longJobTTL is the lease the long-job test gives the backend; the job runs
// for many times as long.
const longJobTTL = time.Second

// TestLongJobKeepsLock runs a job every 500ms on three replicas that works
// for several TTLs. It must run once, keep its lock throughout (no loss
// reported to it), and make every other replica's tick fail with
// contention.
func TestLongJobKeepsLock(t *testing.T) {
	type variant struct {
		name  string
		lopts []lock.Option       // for the backend's AsLocker
		gopts []gocronlock.Option // for the adapter
	}
	variants := []variant{
		// The backend renews its own lease (AsLocker's default).
		{"autorenew", []lock.Option{lock.WithTTL(longJobTTL)}, nil},
		// The backend does not renew; the adapter extends.
		{"extend", []lock.Option{lock.WithTTL(longJobTTL), lock.WithAutoRenew(false)},
			[]gocronlock.Option{gocronlock.WithExtendEvery(longJobTTL / 4)}},
	}
	for _, b := range backends {
		for _, v := range variants {
			t.Run(b.name+"/"+v.name, func(t *testing.T) {
				t.Parallel()
				newLocker, _ := b.fresh(t)
				testLongJob(t, func() *gocronlock.Locker {
					return gocronlock.New(newLocker(v.lopts...), v.gopts...)
				})
			})
		}
	}
}

func testLongJob(t *testing.T, newAdapter func() *gocronlock.Locker) {
	const work = 5 * longJobTTL / 2
	var (
		mu       sync.Mutex
		active   int // runs in progress
		overlap  int // runs that started while another was in progress
		lostErrs []error
		tokens   []uint64
	)
	finished := make(chan bool, 10) // a run that completed its work; whether its lock was live
	adapters := make([]*gocronlock.Locker, len(skewOffsets))
	for i := range adapters {
		adapters[i] = newAdapter()
	}
	c := startCluster(t, time.Now().Add(200*time.Millisecond), skewOffsets, replicaSetup{
		opts: func(i int) []gocron.SchedulerOption {
			return []gocron.SchedulerOption{gocron.WithDistributedLocker(adapters[i])}
		},
		jobs: func(t *testing.T, s gocron.Scheduler, i int, tl *tally) {
			jobOK(t)(s.NewJob(gocron.DurationJob(500*time.Millisecond),
				gocron.NewTask(func(ctx context.Context) {
					h := gocronlock.JobHolder(ctx)
					jctx, cancel := gocronlock.JobContext(ctx)
					defer cancel()
					mu.Lock()
					active++
					if active > 1 {
						overlap++
					}
					if h != nil {
						tokens = append(tokens, h.Token())
					}
					mu.Unlock()
					defer func() {
						mu.Lock()
						active--
						mu.Unlock()
					}()
					select {
					case <-time.After(work):
						finished <- h != nil && h.Err() == nil
					case <-jctx.Done():
						// Shutdown cancels gocron's job context; only a
						// loss is a failure.
						if err := context.Cause(jctx); errors.Is(err, lock.ErrLockLost) {
							mu.Lock()
							lostErrs = append(lostErrs, err)
							mu.Unlock()
						}
					}
				}),
				gocron.WithName("long"), lockErrors(tl)))
		},
	})
	select {
	case live := <-finished:
		if !live {
			t.Error("the run finished without a live lock")
		}
	case <-time.After(20 * time.Second):
		t.Fatal("no run finished")
	}
	c.shutdown()
	for _, a := range adapters {
		a.Close()
	}

	mu.Lock()
	defer mu.Unlock()
	if overlap != 0 {
		t.Errorf("%d runs started while another held the lock", overlap)
	}
	if len(lostErrs) != 0 {
		t.Errorf("the job's lock was lost: %v", lostErrs)
	}
	if len(tokens) == 0 || tokens[0] == 0 {
		t.Errorf("tokens seen by the job: %v", tokens)
	}
	c.tally.mu.Lock()
	defer c.tally.mu.Unlock()
	errs := c.tally.errs["long"]
	if len(errs) < 3 {
		t.Errorf("only %d ticks of other replicas met the held lock", len(errs))
	}
	for _, err := range errs {
		if !errors.Is(err, lock.ErrLocked) {
			t.Errorf("lock error that is not contention: %v", err)
		}
	}
	t.Logf("a run held its lock for %v (TTL %v); %d ticks meanwhile got ErrLocked; runs started: %d", work, longJobTTL, len(errs), len(tokens))
}
