package gocronlock_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/contrib/gocronlock"
	"github.com/ubgo/lock/etcdlock"
	"github.com/ubgo/lock/internal/testenv"
	"github.com/ubgo/lock/memlock"
	"github.com/ubgo/lock/pglock"
	"github.com/ubgo/lock/redislock"
)

// spreadBackends give each replica of TestSeed12SpreadStarts its own
// client and factory, as separate processes would have; the replicas
// meet on the server under a job name no other test uses.
var spreadBackends = []struct {
	name      string
	newLocker func(t *testing.T) lock.Locker
}{
	{"memlock", nil}, // one factory for the cluster; set in the test
	{"redis", func(t *testing.T) lock.Locker {
		rdb := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr()})
		t.Cleanup(func() { rdb.Close() })
		testenv.Need(t, "redis", func(ctx context.Context) error { return rdb.Ping(ctx).Err() })
		f := redislock.NewFactory(rdb)
		t.Cleanup(func() { f.Close() })
		return f.AsLocker()
	}},
	{"postgres", func(t *testing.T) lock.Locker {
		pool, err := pgxpool.New(context.Background(), testenv.PostgresDSN())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		testenv.Need(t, "postgres", pool.Ping)
		f := pglock.NewFactory(pool)
		t.Cleanup(func() { f.Close() })
		return f.AsLocker()
	}},
	{"etcd", func(t *testing.T) lock.Locker {
		cli, err := clientv3.New(clientv3.Config{Endpoints: testenv.EtcdEndpoints(), DialTimeout: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cli.Close() })
		testenv.Need(t, "etcd", func(ctx context.Context) error { _, err := cli.Get(ctx, "ping"); return err })
		f := etcdlock.NewFactory(cli)
		t.Cleanup(func() { f.Close() })
		return f.AsLocker()
	}},
}

// TestSeed12SpreadStarts is seed scenario 12 as written — a
// gocron.DurationJob on three replicas, each with
// gocron.WithDistributedLocker(gocronlock.New(locks.AsLocker())) and
// default options — deployed as a rolling deploy does: the replicas start
// a third of the interval apart, so their timers fire at three phases
// spread over the whole interval, far beyond any minimum hold. One replica
// must run each interval's work: counted over consecutive intervals, none
// has two runs, and none is skipped (but one at an edge).
func TestSeed12SpreadStarts(t *testing.T) {
	const interval = 2 * time.Second
	periods := 5 // intervals in which every replica fires
	if testing.Short() {
		periods = 3
	}
	for _, b := range spreadBackends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			newLocker := b.newLocker
			if newLocker == nil {
				f := memlock.NewFactory()
				t.Cleanup(func() { f.Close() })
				newLocker = func(*testing.T) lock.Locker { return f.AsLocker() }
			}
			runSpread(t, newLocker, interval, periods)
		})
	}
}

func runSpread(t *testing.T, newLocker func(*testing.T) lock.Locker, interval time.Duration, periods int) {
	var id [4]byte
	rand.Read(id[:])
	name := "sync-data-" + hex.EncodeToString(id[:])
	const replicas = 3
	offsets := make([]time.Duration, replicas)
	for i := range offsets {
		offsets[i] = time.Duration(i) * interval / replicas
	}

	var (
		mu       sync.Mutex
		runs     []time.Time // when each run started
		who      []int       // which replica ran it
		fires    = make([]int, replicas)
		other    []error // Lock errors that are not contention
		stopping bool    // shutdown cancels Locks in flight: no error
	)
	fired := func(i int, err error) {
		mu.Lock()
		defer mu.Unlock()
		fires[i]++
		if err != nil && !errors.Is(err, lock.ErrLocked) && !(stopping && errors.Is(err, context.Canceled)) {
			other = append(other, err)
		}
	}
	base := time.Now().Add(300 * time.Millisecond)
	scheds := make([]gocron.Scheduler, replicas)
	lockers := make([]*gocronlock.Locker, replicas)
	for i := range scheds {
		lockers[i] = gocronlock.New(newLocker(t))
		if err := lockers[i].Err(); err != nil {
			t.Fatal(err)
		}
		s, err := gocron.NewScheduler(gocron.WithDistributedLocker(lockers[i]))
		if err != nil {
			t.Fatal(err)
		}
		scheds[i] = s
		_, err = s.NewJob(gocron.DurationJob(interval),
			gocron.NewTask(func(ctx context.Context) {
				mu.Lock()
				runs, who = append(runs, time.Now()), append(who, i)
				mu.Unlock()
				time.Sleep(20 * time.Millisecond) // the sync's work
				fired(i, nil)
			}),
			gocron.WithName(name),
			gocron.WithEventListeners(gocron.AfterLockError(func(_ uuid.UUID, _ string, err error) { fired(i, err) })))
		if err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	for i, s := range scheds {
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(time.Until(base.Add(offsets[i]))) // the rolling deploy
			s.Start()
		}()
	}
	wg.Wait()

	// Replica i first fires at base+offsets[i]+interval. Replica 0 fires
	// first and keeps the job, so the runs come at its phase; waiting
	// until it fired periods+1 times and the others periods times covers
	// periods 0..periods of it.
	want := func() bool {
		mu.Lock()
		defer mu.Unlock()
		return fires[0] >= periods+1 && fires[1] >= periods && fires[2] >= periods
	}
	if !waitFor(time.Duration(periods+4)*interval, want) {
		mu.Lock()
		t.Errorf("replicas fired %v times, want %d, %d, %d", fires, periods+1, periods, periods)
		mu.Unlock()
	}
	mu.Lock()
	stopping = true
	mu.Unlock()
	var sd sync.WaitGroup
	for _, s := range scheds {
		sd.Add(1)
		go func() { defer sd.Done(); s.Shutdown() }()
	}
	sd.Wait()
	for _, l := range lockers {
		l.Close()
	}

	mu.Lock()
	defer mu.Unlock()
	if len(runs) == 0 {
		t.Fatalf("no run; fires %v", fires)
	}
	// Periods are centred on the owner's phase, taken from the first run:
	// a run late by less than half an interval (a loaded machine, a slow
	// store) still counts in its own period.
	first := runs[0].Add(-interval / 2)
	perPeriod := make([][]int, periods+1)
	for k, at := range runs {
		p := int(at.Sub(first) / interval)
		if at.Before(first) || p > periods {
			continue
		}
		perPeriod[p] = append(perPeriod[p], who[k])
	}
	var b strings.Builder
	for p, rs := range perPeriod {
		fmt.Fprintf(&b, " %d:%v", p, rs)
	}
	t.Logf("runs per interval (period:[replicas]):%s; fires %v", b.String(), fires)
	var missing []int
	for p, rs := range perPeriod {
		switch {
		case len(rs) > 1:
			t.Errorf("interval %d ran %d times (replicas %v)", p, len(rs), rs)
		case len(rs) == 0:
			missing = append(missing, p)
		}
	}
	// A skipped interval is allowed only at an edge, and only one.
	if len(missing) > 1 || len(missing) == 1 && missing[0] != 0 && missing[0] != periods {
		t.Errorf("intervals %v did not run", missing)
	}
	for _, err := range other {
		t.Errorf("Lock error that is not contention: %v", err)
	}
}
