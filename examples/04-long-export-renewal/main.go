// Command 04-long-export-renewal is use case 4: a daily payment export runs
// far longer than the crash-recovery window you want (90 minutes against a
// 5-minute TTL), so the lease must be renewed while the export runs, and
// the export must stop if the lock is lost anyway.
//
// The export takes the lock with a bare Acquire (it wants the holder, for
// its fencing token) and hands the holder to lock.KeepAlive instead of a
// hand-written renewal goroutine. Underneath, KeepAlive calls the holder's
// Extend every interval, each call bounded by the interval; the context it
// returns is cancelled, with a cause matching lock.ErrLockLost, when an
// Extend fails or hangs, or when the holder reports the lock ended (its
// Done channel: the backend found the key deleted, or its lease deadline
// passed). With the interval at most a third of the TTL, the loss is
// declared before the lease can run out on the server. Its cancel stops the
// renewal; the deferred Release gives the lock up. (WithLock, or a locker
// from AsLocker, renews by itself and needs neither; KeepAlive is for the
// bare Acquire of this scenario.)
//
// The demo runs the export for several TTLs while two other replicas try to
// start it every half TTL and skip; then it runs the export again and an
// operator deletes the lock mid-export (redis-cli DEL / rm of the marker):
// the export's context is cancelled and it stops.
//
//	go run ./04-long-export-renewal                  # filelock, no infrastructure
//	go run ./04-long-export-renewal -backend=redis
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/examples/internal/replica"
)

// DailyPaymentsExport runs the export on this replica unless another one
// is running it; ttl is the lease length of locks. The demo builds locks
// WithAutoRenew(false), so that KeepAlive alone keeps the lease (with a
// locker that renews by itself KeepAlive only adds the watch).
func DailyPaymentsExport(ctx context.Context, locks lock.Locker, ttl time.Duration,
	runExport func(ctx context.Context, fence uint64) error) error {
	holder, err := locks.Acquire(ctx, "daily-export")
	if errors.Is(err, lock.ErrLocked) {
		slog.Info("daily export already running on another replica")
		return nil
	}
	if err != nil {
		return err
	}
	defer holder.Release()

	// Renew every third of the TTL; ctx is cancelled if the lock is lost.
	ctx, cancel := lock.KeepAlive(ctx, holder, ttl/3)
	defer cancel()
	return runExport(ctx, holder.Token())
}

// config sizes the demo.
type config struct {
	TTL      time.Duration // the lease
	Duration time.Duration // how long the healthy export runs (several TTLs)
}

// result is what the demo saw.
type result struct {
	Exported  bool  // the healthy export ran to its end
	Skips     int   // other replicas' attempts that skipped while it ran
	Overlaps  int   // other replicas' attempts that ran an export meanwhile: must be 0
	StolenErr error // the second export's error after the lock was taken away
	StoppedIn time.Duration
}

func run(ctx context.Context, c *replica.Cluster, cfg config) (res result, err error) {
	var replicas []lock.Locker
	for range 3 {
		r, err := c.Replica(ctx, lock.WithTTL(cfg.TTL), lock.WithAutoRenew(false))
		if err != nil {
			return res, err
		}
		replicas = append(replicas, r.Locker())
	}

	var exporting atomic.Int32
	export := func(d time.Duration, started chan<- struct{}) func(ctx context.Context, fence uint64) error {
		return func(ctx context.Context, fence uint64) error {
			exporting.Add(1)
			defer exporting.Add(-1)
			if started != nil {
				close(started)
			}
			fmt.Printf("exporting with fence %d for %v (TTL %v)\n", fence, d, cfg.TTL)
			select {
			case <-time.After(d):
				return nil
			case <-ctx.Done():
				return fmt.Errorf("export aborted: %w", context.Cause(ctx))
			}
		}
	}

	// 1. A healthy export, several TTLs long; the other replicas' crons fire
	// every half TTL meanwhile.
	started := make(chan struct{})
	done := make(chan error, 1)
	go func() { done <- DailyPaymentsExport(ctx, replicas[0], cfg.TTL, export(cfg.Duration, started)) }()
	if err := await(started, done); err != nil {
		return res, err
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	stop := make(chan struct{})
	for _, other := range replicas[1:] {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t := time.NewTicker(cfg.TTL / 2)
			defer t.Stop()
			for {
				select {
				case <-stop:
					return
				case <-t.C:
				}
				ran, overlap := false, false
				err := DailyPaymentsExport(ctx, other, cfg.TTL, func(ctx context.Context, fence uint64) error {
					// Running is fine once the first export has ended;
					// running while it still runs is what the lock prevents.
					ran, overlap = true, exporting.Load() > 0
					return nil
				})
				mu.Lock()
				switch {
				case err != nil:
					log.Printf("other replica: %v", err)
				case overlap:
					res.Overlaps++
				case !ran:
					res.Skips++
				}
				mu.Unlock()
			}
		}()
	}
	err = <-done
	close(stop)
	wg.Wait()
	if err != nil {
		return res, fmt.Errorf("healthy export: %w", err)
	}
	res.Exported = true
	fmt.Printf("export finished; meanwhile the other replicas skipped %d times and ran it %d times\n", res.Skips, res.Overlaps)

	// 2. The lock is taken away mid-export: the export must stop.
	started = make(chan struct{})
	go func() { done <- DailyPaymentsExport(ctx, replicas[0], cfg.TTL, export(time.Minute, started)) }()
	if err := await(started, done); err != nil {
		return res, err
	}
	time.Sleep(cfg.TTL)
	fmt.Println("operator deletes the lock")
	stolen := time.Now()
	if err := takeAway(ctx, c, "daily-export"); err != nil {
		return res, err
	}
	select {
	case res.StolenErr = <-done:
		res.StoppedIn = time.Since(stolen)
		fmt.Printf("export stopped %v later: %v\n", res.StoppedIn.Round(time.Millisecond), res.StolenErr)
	case <-ctx.Done():
		return res, errors.New("the export did not stop after its lock was deleted")
	}
	return res, nil
}

// await waits until the export started, and fails if it returned without
// starting.
func await(started <-chan struct{}, done <-chan error) error {
	select {
	case <-started:
		return nil
	case err := <-done:
		return fmt.Errorf("the export did not start: %v", err)
	}
}

// takeAway deletes a held lock the way the backend's guide tells operators
// to.
func takeAway(ctx context.Context, c *replica.Cluster, name string) error {
	switch c.Backend {
	case replica.Filelock: // rm <dir>/<name>.lock
		return os.Remove(filepath.Join(c.Dir, name+".lock"))
	case replica.Redis: // redis-cli DEL '<prefix>{<name>}:lock'
		r, err := c.Replica(ctx)
		if err != nil {
			return err
		}
		defer r.Close()
		n, err := r.Redis.Del(ctx, c.Prefix+"{"+name+"}:lock").Result()
		if err == nil && n != 1 {
			err = fmt.Errorf("no key %s{%s}:lock", c.Prefix, name)
		}
		return err
	}
	return fmt.Errorf("backend %s: no way to take a lock away", c.Backend)
}

func main() {
	replica.Main(demo, replica.Filelock, replica.Redis)
}

func demo(ctx context.Context, c *replica.Cluster) error {
	_, err := run(ctx, c, config{TTL: 500 * time.Millisecond, Duration: 2 * time.Second})
	return err
}
