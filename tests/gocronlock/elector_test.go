package gocronlock_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-co-op/gocron/v2"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/contrib/gocronlock"
)

const handoverBound = 10 * time.Second // generous: the test measures, it does not race

// leaders samples electors until stop is closed and records the most that
// were leader at the same moment.
type leaders struct {
	els  []*gocronlock.Elector
	most atomic.Int32
	stop chan struct{}
	done chan struct{}
}

func watchLeaders(els []*gocronlock.Elector) *leaders {
	w := &leaders{els: els, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		for {
			n := int32(0)
			for _, e := range els {
				if e.IsLeader(context.Background()) == nil {
					n++
				}
			}
			if n > w.most.Load() {
				w.most.Store(n)
			}
			select {
			case <-w.stop:
				return
			case <-time.After(time.Millisecond):
			}
		}
	}()
	return w
}

func (w *leaders) close() int {
	close(w.stop)
	<-w.done
	return int(w.most.Load())
}

// leader returns the index of the single elector that is leader, or -1.
func (w *leaders) leader() int {
	found := -1
	for i, e := range w.els {
		if e.IsLeader(context.Background()) == nil {
			if found >= 0 {
				return -2
			}
			found = i
		}
	}
	return found
}

// awaitLeader waits for a leader other than the excluded ones.
func (w *leaders) awaitLeader(t *testing.T, exclude ...int) (int, time.Duration) {
	t.Helper()
	start := time.Now()
	got := -1
	ok := waitFor(handoverBound, func() bool {
		got = w.leader()
		if got < 0 {
			return false
		}
		for _, x := range exclude {
			if got == x {
				return false
			}
		}
		return true
	})
	if !ok {
		t.Fatalf("no new leader within %v (excluding %v; now %d)", handoverBound, exclude, got)
	}
	return got, time.Since(start)
}

// TestElectorHandsOver runs three schedulers whose elector share a backend
// and a cron job every second. Leadership moves when the leader's lock is
// lost (memlock's ForceLoss) and when the leader stops; never are two
// replicas leader at once, and no tick runs twice across a handover.
func TestElectorHandsOver(t *testing.T) {
	for _, b := range backends {
		for _, wait := range []bool{true, false} {
			name := b.name + "/polling"
			if wait {
				name = b.name + "/waiting"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				newLocker, lose := b.fresh(t)
				var lopts []lock.Option
				if wait {
					lopts = append(lopts, lock.WithWait())
				} else {
					// A polling campaign can win the lock back right
					// after losing it; only the stop hand-over is tested.
					lose = nil
				}
				testElector(t, func() lock.Locker { return newLocker(lopts...) }, lose, b.syncLoss)
			})
		}
	}
}

func testElector(t *testing.T, newLocker func() lock.Locker, lose func(name string), syncLoss bool) {
	els := make([]*gocronlock.Elector, len(skewOffsets))
	for i := range els {
		els[i] = gocronlock.NewElector(newLocker(), "leader", gocronlock.WithRetryInterval(200*time.Millisecond))
	}
	defer func() {
		for _, e := range els {
			e.Close()
		}
	}()
	w := watchLeaders(els)
	c := startCluster(t, time.Now().Add(100*time.Millisecond), skewOffsets, replicaSetup{
		opts: func(i int) []gocron.SchedulerOption {
			return []gocron.SchedulerOption{gocron.WithDistributedElector(els[i])}
		},
		jobs: func(t *testing.T, s gocron.Scheduler, i int, tl *tally) {
			jobOK(t)(s.NewJob(gocron.CronJob("* * * * * *", true),
				gocron.NewTask(countingTask(tl, "leader-job", i, cronTick, 20*time.Millisecond)),
				gocron.WithName("leader-job")))
		},
	})

	first, d := w.awaitLeader(t)
	t.Logf("replica %d leads after %v", first, d)
	time.Sleep(1500 * time.Millisecond) // let it run a tick or two
	next := first
	if lose != nil {
		lose(gocronlock.DefaultKeyPrefix + "leader")
		start := time.Now()
		if !waitFor(handoverBound, func() bool { return els[first].IsLeader(context.Background()) != nil }) {
			t.Fatalf("replica %d still leader %v after losing its lock", first, handoverBound)
		}
		t.Logf("lock lost: replica %d stepped down after %v", first, time.Since(start))
		if syncLoss {
			// The loss was immediate, and the lock went to a waiter.
			if err := els[first].IsLeader(context.Background()); !errors.Is(err, gocronlock.ErrNotLeader) || !errors.Is(err, lock.ErrLockLost) {
				t.Errorf("IsLeader right after the loss = %v", err)
			}
			next, d = w.awaitLeader(t, first)
		} else {
			// Whoever campaigns first after the loss wins, the loser
			// included.
			next, d = w.awaitLeader(t)
		}
		t.Logf("lock lost: replica %d leads after %v", next, d)
		time.Sleep(1500 * time.Millisecond)
	}
	// The leader's replica goes away.
	if err := els[next].Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	c.stop(next)
	third, d := w.awaitLeader(t, next)
	t.Logf("leader stopped: replica %d leads after %v", third, d)
	time.Sleep(1500 * time.Millisecond)
	c.shutdown()

	if most := w.close(); most > 1 {
		t.Errorf("%d replicas were leader at once", most)
	}
	t.Logf("leader-job runs per tick (tick:count[replicas]):%s", c.tally.report("leader-job"))
	if m := c.tally.maxRuns("leader-job"); m != 1 {
		t.Errorf("most runs of one tick = %d, want 1", m)
	}
}
