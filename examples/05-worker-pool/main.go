// Command 05-worker-pool is use case 5: 50 batches to index, and never more
// than 3 indexers at once across the host, because beyond 3 the search
// backend saturates.
//
// The name "indexer" is a semaphore of 3 permits (WithMaxConcurrent(3)),
// and every batch waits for a permit (WithWait()) instead of retrying in a
// sleep loop. Underneath, a waiting Acquire is woken when a permit is
// released — directly within a process, by an inotify watch of the lock
// directory across processes (filelock, flock), by pub/sub (redislock),
// NOTIFY (pglock) or a watch (etcdlock) — with polling only as a fallback
// for permits freed by a crash; it gives up when its context ends, with an
// error matching both ErrLocked and the context's error. Every holder of
// the name must use the same limit; one that passes another gets
// lock.ErrLimitMismatch instead of a silent fourth permit. On disk
// (filelock) the permits are <dir>/indexer.0.lock, .1.lock and .2.lock.
//
// The demo runs the 50 batches from two worker processes (two factories on
// one lock directory), 25 each, and reports the most batches that were
// ever indexing at once.
//
//	go run ./05-worker-pool                        # filelock: the scenario's backend, no infrastructure
//	go run ./05-worker-pool -backend=flock         # or postgres, redis, etcd
package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/examples/internal/replica"
)

// Batch is one unit of indexing work.
type Batch struct{ ID int }

// IndexBatches indexes every batch, at most 3 at a time across every
// process that indexes with the same lock store. indexers is a Locker built
// with WithMaxConcurrent(3) and WithWait().
func IndexBatches(ctx context.Context, indexers lock.Locker, batches []Batch,
	indexBatch func(ctx context.Context, b Batch) error) error {
	var wg sync.WaitGroup
	errs := make([]error, len(batches))
	for i, b := range batches {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = lock.WithLock(ctx, indexers, "indexer", func(ctx context.Context) error {
				return indexBatch(ctx, b)
			})
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// config sizes the demo.
type config struct {
	Batches   int
	Processes int
	Limit     int
	Work      time.Duration // one batch
}

// result is what the demo saw.
type result struct {
	Indexed int // batches indexed
	Peak    int // most batches indexing at once
	// Mismatch is what a misconfigured process, asking for Limit+1
	// permits while batches are indexing, got.
	Mismatch error
}

func run(ctx context.Context, c *replica.Cluster, cfg config) (res result, err error) {
	misconfigured, err := c.Replica(ctx)
	if err != nil {
		return res, err
	}
	var inside, peak, indexed atomic.Int32
	indexBatch := func(ctx context.Context, b Batch) error {
		n := inside.Add(1)
		defer inside.Add(-1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		if b.ID == 0 {
			h, err := misconfigured.Locker(lock.WithMaxConcurrent(cfg.Limit+1)).Acquire(ctx, "indexer")
			if err == nil {
				h.Release()
				err = errors.New("a fourth permit was granted")
			}
			res.Mismatch = err
			fmt.Printf("a process asking for %d permits: %v\n", cfg.Limit+1, err)
		}
		select {
		case <-time.After(cfg.Work):
			indexed.Add(1)
			return nil
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}

	var wg sync.WaitGroup
	errs := make([]error, cfg.Processes)
	for p := range cfg.Processes {
		// One process: its own factory, whose every Acquire of "indexer"
		// waits for one of the Limit permits.
		r, err := c.Replica(ctx)
		if err != nil {
			return res, err
		}
		indexers := r.Locker(lock.WithMaxConcurrent(cfg.Limit), lock.WithWait())
		var batches []Batch
		for id := p; id < cfg.Batches; id += cfg.Processes {
			batches = append(batches, Batch{ID: id})
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[p] = IndexBatches(ctx, indexers, batches, indexBatch)
		}()
	}
	wg.Wait()
	res.Indexed, res.Peak = int(indexed.Load()), int(peak.Load())
	return res, errors.Join(errs...)
}

func main() {
	replica.Main(demo, replica.Filelock, replica.Filelock, replica.Flock, replica.Postgres, replica.Redis, replica.Etcd)
}

func demo(ctx context.Context, c *replica.Cluster) error {
	start := time.Now()
	res, err := run(ctx, c, config{Batches: 50, Processes: 2, Limit: 3, Work: 20 * time.Millisecond})
	if err != nil {
		return err
	}
	fmt.Printf("%s: indexed %d batches in %v from 2 processes, at most %d at once\n",
		c.Backend, res.Indexed, time.Since(start).Round(time.Millisecond), res.Peak)
	return nil
}
