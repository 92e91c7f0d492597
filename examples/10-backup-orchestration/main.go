// Command 10-backup-orchestration is use case 10: a backup (snapshot the
// database, upload it) must run exactly once per day across a fleet of ten
// hosts; the first host to wake up does it, every other one skips — even a
// host whose timer fires an hour late, after the backup finished.
//
// Each host's daily timer calls lock.RunOncePer with the day's tick.
// Underneath, RunOncePer names the day with lock.PeriodKey
// ("backup@2026-05-04T00:00:00Z") — computed from the tick the timer was
// scheduled for, not time.Now(), so hosts whose timers fire a little apart
// around midnight agree — and calls lock.RunOnce: a day already in the
// ledger returns at once; otherwise it acquires the day's lock (a host that
// finds it held gets ErrLocked: another host is on it, skip), checks the
// ledger again under the lock, runs the backup with a context cancelled if
// the lock is lost, records the day with the holder's fencing token, and
// releases. The lock's lease is renewed in the background while the backup
// runs (AsLocker), so the TTL (2h) is only how long a crashed host blocks
// the day; the crashed day is not recorded, and the next host to fire
// retries it.
//
// With -backend=etcd (the scenario's backend) the locks and the ledger are
// in etcd (etcdlock.NewLedger: a record is a key created only if absent,
// in one Txn); with -backend=redis (if AP is fine) both are in Redis
// (redislock.NewLedger). With no infrastructure the hosts are filelock
// factories on one directory, with filelock.NewLedger on it.
//
//	go run ./10-backup-orchestration
//	go run ./10-backup-orchestration -backend=etcd
package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/examples/internal/replica"
)

// DailyBackup is a host's daily timer: it backs up unless another host is
// doing, or has done, the day's backup.
func DailyBackup(ctx context.Context, locks lock.Locker, ledger lock.Ledger, tick time.Time,
	runBackup func(ctx context.Context) error) (ran bool, err error) {
	ran, err = lock.RunOncePer(ctx, locks, ledger, "backup", 24*time.Hour, tick, runBackup)
	if errors.Is(err, lock.ErrLocked) {
		return false, nil // another host is running today's backup
	}
	return ran, err
}

// config sizes the demo.
type config struct {
	Hosts  int
	Days   int
	Jitter time.Duration // how far apart the hosts' timers fire
	Late   int           // hosts per day whose timer fires after the backup finished
	Work   time.Duration // one backup
}

// result: which host backed up each day.
type result struct {
	Backups   map[string][]string // day → hosts that ran its backup
	LateSkips int
}

func run(ctx context.Context, c *replica.Cluster, cfg config) (result, error) {
	res := result{Backups: map[string][]string{}}
	type host struct {
		name   string
		locks  lock.Locker
		ledger lock.Ledger
	}
	hosts := make([]host, cfg.Hosts)
	for i := range hosts {
		name := fmt.Sprintf("host-%02d", i+1)
		r, err := c.Replica(ctx, lock.WithTTL(2*time.Hour), lock.WithOwner(name))
		if err != nil {
			return res, err
		}
		hosts[i] = host{name, r.Locker(), c.Ledger(r)}
	}
	var mu sync.Mutex
	backup := func(h host, day string) func(ctx context.Context) error {
		return func(ctx context.Context) error {
			mu.Lock()
			res.Backups[day] = append(res.Backups[day], h.name)
			mu.Unlock()
			fmt.Printf("%s: backing up %s\n", h.name, day)
			select {
			case <-time.After(cfg.Work):
				return nil
			case <-ctx.Done():
				return context.Cause(ctx)
			}
		}
	}

	midnight := time.Date(2026, 5, 4, 0, 0, 0, 0, time.UTC)
	for d := range cfg.Days {
		tick := midnight.AddDate(0, 0, d)
		day := tick.Format("2006-01-02")
		var wg sync.WaitGroup
		errs := make([]error, len(hosts)-cfg.Late)
		for i, h := range hosts[cfg.Late:] {
			wg.Add(1)
			go func() {
				defer wg.Done()
				time.Sleep(rand.N(cfg.Jitter + 1))
				_, errs[i] = DailyBackup(ctx, h.locks, h.ledger, tick, backup(h, day))
			}()
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			return res, err
		}
		// The late hosts fire after the backup finished and released.
		for _, h := range hosts[:cfg.Late] {
			ran, err := DailyBackup(ctx, h.locks, h.ledger, tick, backup(h, day))
			if err != nil {
				return res, err
			}
			if !ran {
				res.LateSkips++
				fmt.Printf("%s (late): %s already backed up\n", h.name, day)
			}
		}
	}
	return res, nil
}

func main() {
	replica.Main(demo, replica.Filelock, replica.Etcd, replica.Redis)
}

func demo(ctx context.Context, c *replica.Cluster) error {
	res, err := run(ctx, c, config{Hosts: 10, Days: 2, Jitter: 20 * time.Millisecond, Late: 2, Work: 50 * time.Millisecond})
	if err != nil {
		return err
	}
	fmt.Printf("backups per day: %v; late hosts that skipped: %d\n", res.Backups, res.LateSkips)
	return nil
}
