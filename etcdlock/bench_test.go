package etcdlock_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/ubgo/lock/etcdlock"
	"github.com/ubgo/lock/internal/testenv"
)

// Run with: go test -run '^$' -bench . -benchtime 500x ./etcdlock
//
// Every sub-benchmark talks to the same server in the same run, so the
// ratios hold whatever the disk under etcd; BenchmarkUncontendedInterleaved
// gives the steadiest ratio on a noisy machine.

// BenchmarkUncontended: acquire+release of a free lock, beside the floor —
// the fewest round trips it can take (a put-if-absent transaction on a
// lease granted beforehand, then a delete) — and etcd's own
// concurrency.Mutex (Lock+Unlock on a session made beforehand).
func BenchmarkUncontended(b *testing.B) {
	cli := client(b)
	prefix := testPrefix(b)
	ctx := context.Background()

	b.Run("floor", func(b *testing.B) {
		lease, err := cli.Grant(ctx, 60)
		if err != nil {
			b.Fatal(err)
		}
		defer cli.Revoke(ctx, lease.ID)
		key := prefix + "floor"
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			resp, err := cli.Txn(ctx).
				If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
				Then(clientv3.OpPut(key, "v", clientv3.WithLease(lease.ID))).
				Else(clientv3.OpGet(key)).
				Commit()
			if err != nil || !resp.Succeeded {
				b.Fatalf("put-if-absent: %v", err)
			}
			if _, err := cli.Delete(ctx, key); err != nil {
				b.Fatal(err)
			}
		}
	})

	b.Run("etcdlock", func(b *testing.B) {
		f := factory(b, cli, etcdlock.WithKeyPrefix(prefix), etcdlock.WithLogger(nil))
		warm, err := f.Acquire(ctx, "warm") // grant the lease, start the watch
		if err != nil {
			b.Fatal(err)
		}
		defer warm.Release()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			h, err := f.Acquire(ctx, "uncontended")
			if err != nil {
				b.Fatal(err)
			}
			if err := h.Release(); err != nil {
				b.Fatal(err)
			}
		}
	})

	b.Run("concurrency.Mutex", func(b *testing.B) {
		s, err := concurrency.NewSession(cli, concurrency.WithTTL(60))
		if err != nil {
			b.Fatal(err)
		}
		defer s.Close()
		m := concurrency.NewMutex(s, prefix+"mutex")
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if err := m.Lock(ctx); err != nil {
				b.Fatal(err)
			}
			if err := m.Unlock(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkUncontendedInterleaved runs the three of BenchmarkUncontended
// in turn within each iteration, so that a noisy machine slows them alike;
// it reports each one's time per acquire+release and the ratios.
func BenchmarkUncontendedInterleaved(b *testing.B) {
	cli := client(b)
	prefix := testPrefix(b)
	ctx := context.Background()
	lease, err := cli.Grant(ctx, 60)
	if err != nil {
		b.Fatal(err)
	}
	defer cli.Revoke(ctx, lease.ID)
	f := factory(b, cli, etcdlock.WithKeyPrefix(prefix), etcdlock.WithLogger(nil))
	warm, err := f.Acquire(ctx, "warm")
	if err != nil {
		b.Fatal(err)
	}
	defer warm.Release()
	s, err := concurrency.NewSession(cli, concurrency.WithTTL(60))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	m := concurrency.NewMutex(s, prefix+"mutex")
	floorKey := prefix + "floor"
	ops := []func() error{
		func() error {
			resp, err := cli.Txn(ctx).
				If(clientv3.Compare(clientv3.CreateRevision(floorKey), "=", 0)).
				Then(clientv3.OpPut(floorKey, "v", clientv3.WithLease(lease.ID))).
				Else(clientv3.OpGet(floorKey)).
				Commit()
			if err == nil && !resp.Succeeded {
				err = errors.New("floor key exists")
			}
			if err == nil {
				_, err = cli.Delete(ctx, floorKey)
			}
			return err
		},
		func() error {
			h, err := f.Acquire(ctx, "uncontended")
			if err == nil {
				err = h.Release()
			}
			return err
		},
		func() error {
			err := m.Lock(ctx)
			if err == nil {
				err = m.Unlock(ctx)
			}
			return err
		},
	}
	var spent [3]time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for j := range ops {
			k := (i + j) % len(ops) // rotate the order too
			start := time.Now()
			if err := ops[k](); err != nil {
				b.Fatal(err)
			}
			spent[k] += time.Since(start)
		}
	}
	per := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / float64(b.N) }
	b.ReportMetric(per(spent[0]), "floor-ns/op")
	b.ReportMetric(per(spent[1]), "etcdlock-ns/op")
	b.ReportMetric(per(spent[2]), "mutex-ns/op")
	b.ReportMetric(per(spent[1])/per(spent[0]), "etcdlock/floor")
	b.ReportMetric(per(spent[2])/per(spent[0]), "mutex/floor")
}

// contender is one process-like participant: its own client.
type contender struct {
	lock, unlock func(ctx context.Context) error
}

// BenchmarkContended: 9 contenders, each with its own client, take one lock
// in turn as fast as they can, so that 8 wait behind the holder. b.N is the
// total number of acquisitions. Reported:
//   - handoff-p50/p99-µs: from the holder calling Release to the next
//     holder's Acquire returning (one delete round trip plus the wake-up);
//   - wake-p50/p99-µs: from the holder's Release returning to the next
//     holder's Acquire returning (the wake-up alone; below zero when the
//     waiter is woken before the releaser has its answer);
//   - acquires/s: throughput under contention.
func BenchmarkContended(b *testing.B) {
	const n = 9
	prefix := testPrefix(b)
	clients := make([]*clientv3.Client, n)
	for i := range clients {
		cli, err := dial(b, testenv.EtcdEndpoints())
		if err != nil {
			testenv.Unavailable(b, "etcd", err)
		}
		b.Cleanup(func() { cli.Close() })
		clients[i] = cli
	}

	b.Run("etcdlock", func(b *testing.B) {
		cs := make([]contender, n)
		for i, cli := range clients {
			f := factory(b, cli, etcdlock.WithKeyPrefix(prefix), etcdlock.WithLogger(nil))
			var h *etcdlock.Holder
			cs[i] = contender{
				lock: func(ctx context.Context) (err error) {
					h, err = f.Acquire(ctx, "contended", etcdlock.WithWait())
					return err
				},
				unlock: func(context.Context) error { return h.Release() },
			}
			// Start each factory's watch and lease outside the timing.
			if err := cs[i].lock(context.Background()); err != nil {
				b.Fatal(err)
			}
			if err := cs[i].unlock(context.Background()); err != nil {
				b.Fatal(err)
			}
		}
		contend(b, cs)
	})

	b.Run("concurrency.Mutex", func(b *testing.B) {
		cs := make([]contender, n)
		for i, cli := range clients {
			s, err := concurrency.NewSession(cli, concurrency.WithTTL(60))
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { s.Close() })
			m := concurrency.NewMutex(s, prefix+"mutex")
			cs[i] = contender{lock: m.Lock, unlock: m.Unlock}
		}
		contend(b, cs)
	})
}

func contend(b *testing.B, cs []contender) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	// Per acquisition, in the order the lock passed: when it was acquired,
	// and when its release started and ended (ns since base).
	acq, relStart, relEnd := make([]int64, b.N), make([]int64, b.N), make([]int64, b.N)
	var (
		seq      int // guarded by the lock under test
		claimed  atomic.Int64
		base     = time.Now()
		wg       sync.WaitGroup
		errOnce  sync.Once
		firstErr error
		inside   atomic.Int32
		overlap  atomic.Bool
	)
	b.ResetTimer()
	for _, c := range cs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for claimed.Add(1) <= int64(b.N) {
				if err := c.lock(ctx); err != nil {
					errOnce.Do(func() { firstErr = err })
					cancel()
					return
				}
				at := int64(time.Since(base))
				if inside.Add(1) != 1 {
					overlap.Store(true)
				}
				k := seq
				seq++
				inside.Add(-1)
				acq[k] = at
				relStart[k] = int64(time.Since(base))
				if err := c.unlock(ctx); err != nil {
					errOnce.Do(func() { firstErr = err })
					cancel()
					return
				}
				relEnd[k] = int64(time.Since(base))
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	elapsed := time.Duration(slices.Max(relEnd))
	if firstErr != nil {
		b.Fatal(firstErr)
	}
	if overlap.Load() {
		b.Fatal("two holders at once")
	}
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "acquires/s")
	if b.N < 2 {
		return
	}
	var handoff, wake []time.Duration
	for k := 1; k < b.N; k++ {
		handoff = append(handoff, time.Duration(acq[k]-relStart[k-1]))
		wake = append(wake, time.Duration(acq[k]-relEnd[k-1]))
	}
	b.ReportMetric(pct(handoff, 50), "handoff-p50-µs")
	b.ReportMetric(pct(handoff, 99), "handoff-p99-µs")
	b.ReportMetric(pct(wake, 50), "wake-p50-µs")
	b.ReportMetric(pct(wake, 99), "wake-p99-µs")
}

func pct(ds []time.Duration, p int) float64 {
	s := slices.Clone(ds)
	slices.Sort(s)
	return float64(s[(len(s)-1)*p/100]) / float64(time.Microsecond)
}
