package redislock

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
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

// contended is one run of workers taking turns on one name, each with its
// own factory and client, as separate processes would.
type contended struct {
	acquisitions int
	calls        int64 // commands clients sent (scripts count once), from INFO commandstats
	all          int64 // every command, also those run inside scripts
	scripts      int64 // acquire script runs
	retook       int   // acquisitions by the worker that released last
	perWorker    []int
	elapsed      time.Duration
	maxWait      time.Duration // the longest Acquire
	handoffP50   time.Duration // from a Release call to the next Acquire's return
}

func (c contended) String() string {
	n := float64(c.acquisitions)
	return fmt.Sprintf("%d acquisitions: %.1f calls/acq (%.1f with script-internal), %.2f acquire scripts/acq, %.0f acq/s, max wait %v, hand-off p50 %v, releaser retook %.0f%%",
		c.acquisitions, float64(c.calls)/n, float64(c.all)/n, float64(c.scripts)/n, n/c.elapsed.Seconds(),
		c.maxWait.Round(10*time.Microsecond), c.handoffP50.Round(time.Microsecond), 100*float64(c.retook)/n)
}

// clientCommands are the commands a client sends; the rest of
// commandstats is what scripts run inside.
var clientCommands = map[string]bool{"evalsha": true, "eval": true, "evalsha_ro": true, "eval_ro": true,
	"subscribe": true, "unsubscribe": true, "ping": true, "script|load": true, "script|exists": true}

// commandStats returns the calls of every command so far: those clients
// send, and all.
func commandStats(t testing.TB, rdb *redis.Client) (client, all int64) {
	t.Helper()
	s, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(s, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":calls=")
		if !ok {
			continue
		}
		name = strings.TrimPrefix(name, "cmdstat_")
		if name == "info" {
			continue
		}
		n, _ := strconv.ParseInt(rest[:strings.IndexByte(rest, ',')], 10, 64)
		all += n
		if clientCommands[name] {
			client += n
		}
	}
	return client, all
}

// pollObtain is what bsm/redislock runs per try (SET NX PX in a script);
// pollers retry it every millisecond and release with floorRelease.
var pollObtain = redis.NewScript(`return redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])`)

// runContended has workers (each its own client on addr, and for
// "redislock" its own factory) take and release one name until total
// acquisitions are done, on a semaphore of limit permits if limit > 1. mode
// "poll" is a bsm/redislock-style poller that tries every millisecond.
func runContended(t testing.TB, addr, mode string, workers, total, limit int) contended {
	admin := dial(t, addr)
	ctx := context.Background()
	name := uniq(t, mode)
	key := testPrefix + "poll:{" + name + "}"
	type worker struct {
		f  *Factory
		cc *countClient
	}
	ws := make([]worker, workers)
	for i := range ws {
		cc := &countClient{Client: dial(t, addr)}
		ws[i] = worker{cc: cc}
		if mode == "redislock" {
			ws[i].f = NewFactory(cc, WithKeyPrefix(testPrefix), WithLogger(nil), WithTTL(10*time.Second))
			defer ws[i].f.Close()
		}
		cc.Ping(ctx)
	}
	mutexAcquire.Load(ctx, admin)
	mutexRelease.Load(ctx, admin)
	pollObtain.Load(ctx, admin)
	floorRelease.Load(ctx, admin)

	var (
		mu       sync.Mutex
		res      = contended{perWorker: make([]int, workers)}
		handoffs []time.Duration
		last     = -1
		released time.Time
		left     atomic.Int64
		wg       sync.WaitGroup
	)
	left.Store(int64(total))
	acquire := func(i int) (func(), error) {
		if mode == "redislock" {
			h, err := ws[i].f.Acquire(ctx, name, WithWait(), WithMaxConcurrent(limit))
			if err != nil {
				return nil, err
			}
			return func() { h.Release() }, nil
		}
		val := strconv.Itoa(i)
		for {
			err := pollObtain.Run(ctx, ws[i].cc, []string{key}, val, 10000).Err()
			if err != nil && err != redis.Nil {
				return nil, err
			}
			if err == nil { // OK; a nil reply when it is taken
				return func() { floorRelease.Run(ctx, ws[i].cc, []string{key}, val) }, nil
			}
			time.Sleep(time.Millisecond)
		}
	}
	c0, a0 := commandStats(t, admin)
	start := time.Now()
	for i := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				t0 := time.Now()
				release, err := acquire(i)
				if err != nil {
					t.Error(err)
					return
				}
				now := time.Now()
				mu.Lock()
				res.acquisitions++
				res.perWorker[i]++
				res.maxWait = max(res.maxWait, now.Sub(t0))
				if last == i {
					res.retook++
				} else if last >= 0 {
					handoffs = append(handoffs, now.Sub(released))
				}
				last = i
				released = time.Now()
				mu.Unlock()
				n := left.Add(-1)
				release()
				if n <= 0 {
					return
				}
			}
		}()
	}
	wg.Wait()
	res.elapsed = time.Since(start)
	c1, a1 := commandStats(t, admin)
	res.calls, res.all = c1-c0, a1-a0
	for _, w := range ws {
		res.scripts += w.cc.acquires.Load()
	}
	if mode == "poll" {
		res.scripts = res.calls - int64(res.acquisitions) // every try but the releases
	}
	slices.Sort(handoffs)
	if len(handoffs) > 0 {
		res.handoffP50 = handoffs[len(handoffs)/2]
	}
	return res
}

// TestContendedCalls: with 8 waiting factories on one name, an acquisition
// costs at most 8 commands from the clients (a release wakes one waiter,
// not all), and the waiters take turns: none goes without. It runs on a
// private server, so that other users of the shared one do not add to the
// counts.
func TestContendedCalls(t *testing.T) {
	srv := startServer(t)
	const workers = 8
	for _, limit := range []int{1, 3} {
		r := runContended(t, srv.addr(), "redislock", workers, 50*workers, limit)
		t.Logf("limit %d: %v", limit, r)
		if perAcq := float64(r.calls) / float64(r.acquisitions); perAcq > 8 {
			t.Errorf("limit %d: %.1f calls per acquisition; want at most 8", limit, perAcq)
		}
		for i, n := range r.perWorker {
			if n < 25 { // FIFO turns give each about 50
				t.Errorf("limit %d: worker %d acquired %d times of %d; want its turn (%v)", limit, i, n, r.acquisitions, r.perWorker)
			}
		}
	}
}

// BenchmarkContended measures 8 and 64 waiting workers, each with its own
// factory and client, beside a bsm/redislock-style poller retrying every
// millisecond, on a private server. Each b.N is one run.
func BenchmarkContended(b *testing.B) {
	srv := startServer(b)
	for _, workers := range []int{8, 64} {
		for _, mode := range []string{"redislock", "poll"} {
			b.Run(fmt.Sprintf("%s-%d", mode, workers), func(b *testing.B) {
				for b.Loop() {
					r := runContended(b, srv.addr(), mode, workers, 2000, 1)
					b.Log(r)
					n := float64(r.acquisitions)
					b.ReportMetric(float64(r.calls)/n, "calls/acq")
					b.ReportMetric(float64(r.scripts)/n, "acquire-scripts/acq")
					b.ReportMetric(n/r.elapsed.Seconds(), "acq/s")
					b.ReportMetric(float64(r.maxWait.Microseconds())/1000, "ms/max-wait")
					b.ReportMetric(float64(r.handoffP50.Microseconds()), "µs/handoff-p50")
					b.ReportMetric(100*float64(r.retook)/n, "%retook")
				}
			})
		}
	}
}
