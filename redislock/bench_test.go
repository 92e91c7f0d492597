package redislock

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// The raw floor: the fewest round trips a correct Redis lock needs, SET NX
// PX to take it and a compare-and-delete script to give it up.
var floorRelease = redis.NewScript(`if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0`)

func floorCycle(ctx context.Context, rdb *redis.Client, key, val string) error {
	ok, err := rdb.SetNX(ctx, key, val, 30*time.Second).Result()
	if err != nil || !ok {
		return fmt.Errorf("floor SET NX: %v %v", ok, err)
	}
	return floorRelease.Run(ctx, rdb, []string{key}, val).Err()
}

// BenchmarkAcquireRelease puts an uncontended Acquire+Release beside the
// floor, interleaved in one loop so that both see the same machine load.
func BenchmarkAcquireRelease(b *testing.B) {
	rdb := newClient(b)
	f := testFactory(b, rdb)
	ctx := context.Background()
	name := uniq(b, "x")
	key := testPrefix + "floor:" + name
	floorRelease.Load(ctx, rdb)
	var ours, floor time.Duration
	for b.Loop() {
		t0 := time.Now()
		h, err := f.Acquire(ctx, name)
		if err != nil {
			b.Fatal(err)
		}
		if err := h.Release(); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if err := floorCycle(ctx, rdb, key, "v"); err != nil {
			b.Fatal(err)
		}
		floor += time.Since(t1)
		ours += t1.Sub(t0)
	}
	n := float64(b.N)
	b.ReportMetric(float64(ours.Nanoseconds())/n, "ns/redislock")
	b.ReportMetric(float64(floor.Nanoseconds())/n, "ns/floor")
	b.ReportMetric(float64(ours)/float64(floor), "ratio")
}

// BenchmarkHandoff: 8 waiters take turns on one name; each hand-off is the
// time from the holder's call to Release to the next holder's Acquire
// returning. "same-factory" waiters share a process (FIFO hand-off);
// "8-factories" are eight clients, like eight processes racing for each
// release. For scale: rtt-p50 is a PING, acquire+release-p50 an uncontended
// Acquire and Release (two round trips of the scripts).
func BenchmarkHandoff(b *testing.B) {
	for _, mode := range []string{"same-factory", "8-factories"} {
		b.Run(mode, func(b *testing.B) {
			const waiters = 8
			rdb := newClient(b)
			var fs []*Factory
			for i := 0; i < waiters; i++ {
				c := rdb
				if mode == "8-factories" {
					c = newClient(b)
				}
				f := NewFactory(c, WithKeyPrefix(testPrefix), WithLogger(nil))
				defer f.Close()
				fs = append(fs, f)
				if mode == "same-factory" {
					fs = fs[:1]
				}
			}
			ctx := context.Background()
			name := uniq(b, "x")
			var released atomic.Int64 // UnixNano of the last Release call
			var mu sync.Mutex
			var samples []time.Duration
			var left atomic.Int64
			left.Store(int64(b.N))
			first, err := fs[0].Acquire(ctx, name)
			if err != nil {
				b.Fatal(err)
			}
			var wg sync.WaitGroup
			start := make(chan struct{})
			for i := 0; i < waiters; i++ {
				f := fs[i%len(fs)]
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					for left.Load() > 0 {
						h, err := f.Acquire(ctx, name, WithWait())
						if err != nil {
							b.Error(err)
							return
						}
						d := time.Duration(time.Now().UnixNano() - released.Load())
						mu.Lock()
						samples = append(samples, d)
						mu.Unlock()
						left.Add(-1)
						released.Store(time.Now().UnixNano())
						h.Release()
					}
				}()
			}
			close(start)
			// Let the waiters queue up before the first hand-off.
			time.Sleep(100 * time.Millisecond)
			b.ResetTimer()
			released.Store(time.Now().UnixNano())
			first.Release()
			wg.Wait()
			b.StopTimer()
			slices.Sort(samples)
			var rtts, cycles []time.Duration
			for i := 0; i < 200; i++ {
				t0 := time.Now()
				rdb.Ping(ctx)
				rtts = append(rtts, time.Since(t0))
				t0 = time.Now()
				h, err := fs[0].Acquire(ctx, name)
				if err != nil {
					b.Fatal(err)
				}
				h.Release()
				cycles = append(cycles, time.Since(t0))
			}
			slices.Sort(rtts)
			slices.Sort(cycles)
			if len(samples) > 0 {
				b.ReportMetric(float64(samples[len(samples)/2].Nanoseconds()), "ns/handoff-p50")
				b.ReportMetric(float64(samples[len(samples)*99/100].Nanoseconds()), "ns/handoff-p99")
			}
			b.ReportMetric(float64(rtts[len(rtts)/2].Nanoseconds()), "ns/rtt-p50")
			b.ReportMetric(float64(cycles[len(cycles)/2].Nanoseconds()), "ns/acquire+release-p50")
		})
	}
}

// BenchmarkRenewPass10k times one renewal pass over 10,000 held locks (one
// pipeline of extend scripts), beside the floor of a pipeline of 10,000
// PEXPIRE commands.
func BenchmarkRenewPass10k(b *testing.B) {
	const n = 10000
	rdb := newClient(b)
	f := NewFactory(rdb, WithKeyPrefix(testPrefix), WithLogger(nil), WithTTL(time.Minute))
	defer f.Close()
	ctx := context.Background()
	base := uniq(b, "")
	hs := make([]*Holder, n)
	var wg sync.WaitGroup
	for g := 0; g < 16; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := g; i < n; i += 16 {
				h, err := f.Acquire(ctx, fmt.Sprintf("%s%d", base, i))
				if err != nil {
					b.Error(err)
					return
				}
				hs[i] = h
			}
		}()
	}
	wg.Wait()
	if b.Failed() {
		return
	}
	var ours, floor time.Duration
	for b.Loop() {
		t0 := time.Now()
		f.wg.Add(1)
		f.rn.renew(hs)
		t1 := time.Now()
		pipe := rdb.Pipeline()
		for _, h := range hs {
			pipe.PExpire(ctx, h.k.lock, time.Minute)
		}
		if _, err := pipe.Exec(ctx); err != nil {
			b.Fatal(err)
		}
		floor += time.Since(t1)
		ours += t1.Sub(t0)
	}
	for _, h := range hs {
		if h.Err() != nil {
			b.Fatalf("lost during renewal: %v", h.Err())
		}
	}
	f.Close()
	pipe := rdb.Pipeline() // the token counters would stay a day
	for _, h := range hs {
		pipe.Del(ctx, h.k.token)
	}
	pipe.Exec(ctx)
	k := float64(b.N)
	b.ReportMetric(float64(ours.Microseconds())/k/1000, "ms/pass")
	b.ReportMetric(float64(floor.Microseconds())/k/1000, "ms/floor-pass")
}
