package bench_test

import (
	"context"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/ubgo/lock/bench"
	"github.com/ubgo/lock/internal/testenv"
)

func TestMain(m *testing.M) {
	bench.SpinIfChild() // the busy loop of the "busy" condition is this binary
	os.Exit(m.Run())
}

// TestShort runs every case of make bench for a handful of iterations
// against the real services, so that the benchmark cannot rot. It checks
// that each case ran, that exclusion held under contention and that the
// report renders; it never looks at how long anything took.
func TestShort(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg := bench.ShortConfig()
	cfg.Local = testing.Short()
	r, err := bench.Run(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{bench.Redis, bench.Postgres, bench.Etcd} {
		t.Run("service="+s, func(t *testing.T) {
			testenv.SkipShort(t, s)
			if err := r.Down[s]; err != nil {
				testenv.Unavailable(t, s, err)
			}
		})
	}
	for _, p := range r.Problems() {
		t.Error(p)
	}

	want := []string{
		"uncontended/idle/memory/sync.Mutex", "uncontended/idle/memory/memlock",
		"uncontended/idle/file/open+flock+close", "uncontended/idle/file/flock",
		"uncontended/idle/file/filelock", "uncontended/idle/file/gofrs-flock",
		"contended/idle/memory/memlock", "contended/idle/file/flock", "contended/idle/file/filelock",
		"contended/idle/file/gofrs-flock",
		"semaphore/idle/memory/memlock", "semaphore/idle/file/flock", "semaphore/idle/file/filelock",
	}
	if r.Down[bench.Redis] == nil {
		want = append(want,
			"uncontended/idle/redis/PING", "uncontended/idle/redis/SET NX PX + CAD", "uncontended/idle/redis/redislock",
			"uncontended/idle/redis/bsm-redislock", "uncontended/idle/redis/redsync",
			"contended/idle/redis/redislock", "contended/idle/redis/redislock, one factory",
			"contended/idle/redis/bsm-redislock", "contended/idle/redis/redsync", "semaphore/idle/redis/redislock",
			"renewal/redis/PEXPIRE pipeline", "renewal/redis/redislock", "renewal/redis/bsm-redislock", "renewal/redis/redsync")
	}
	if r.Down[bench.Postgres] == nil {
		want = append(want,
			"uncontended/idle/postgres/SELECT 1", "uncontended/idle/postgres/try_advisory_lock + unlock",
			"uncontended/idle/postgres/pglock", "contended/idle/postgres/pglock",
			"contended/idle/postgres/pglock, one factory", "contended/idle/postgres/pg_advisory_lock (blocking)",
			"semaphore/idle/postgres/pglock",
			"connections/postgres")
	}
	if r.Down[bench.Etcd] == nil {
		want = append(want,
			"uncontended/idle/etcd/Get", "uncontended/idle/etcd/Put", "uncontended/idle/etcd/txn put-if-absent + delete",
			"uncontended/idle/etcd/etcdlock", "uncontended/idle/etcd/concurrency.Mutex",
			"contended/idle/etcd/etcdlock", "contended/idle/etcd/etcdlock, one factory",
			"contended/idle/etcd/concurrency.Mutex", "semaphore/idle/etcd/etcdlock",
			"renewal/etcd/KeepAliveOnce", "renewal/etcd/etcdlock", "renewal/etcd/concurrency.Mutex")
	}
	counts := r.Counts()
	if r.BusyNote == "" {
		for _, k := range want {
			if strings.Contains(k, "/idle/") {
				want = append(want, strings.Replace(k, "/idle/", "/busy/", 1))
			}
		}
	} else {
		t.Logf("busy condition not measured: %s", r.BusyNote)
	}
	for _, k := range want {
		if counts[k] <= 0 {
			t.Errorf("case %q did not run (count %d)", k, counts[k])
		}
	}
	for k, n := range counts {
		if n <= 0 {
			t.Errorf("case %q made no measurement", k)
		}
	}

	// The servers' own counters were read: every contended case on a
	// server did some work per acquisition (Postgres's is counted with
	// idle CPUs only).
	work := r.ServerWork()
	for _, k := range want {
		if strings.HasPrefix(k, "contended/") && !strings.Contains(k, "/memory/") && !strings.Contains(k, "/file/") &&
			(strings.Contains(k, "/idle/") || !strings.Contains(k, "/postgres/")) && work[k] <= 0 {
			t.Errorf("case %q: server work per acquisition %v, want > 0", k, work[k])
		}
	}

	md := r.Markdown()
	for _, s := range []string{"## Machine", "## Uncontended acquire+release", "## Contention", "## Semaphore", "## Targets", "| memory/memlock"} {
		if !strings.Contains(md, s) {
			t.Errorf("report lacks %q", s)
		}
	}
	if testing.Verbose() {
		t.Log("\n" + md)
	}
}

// TestServerWork checks that Postgres's statement count of a contended
// window is complete: the blocking advisory lock floor runs exactly two
// statements per acquisition (lock and unlock); counts of the window that
// were missed read near 0 (as they did before the passes waited for their
// backends to leave). Other clients of the database (the tests of other
// packages, run in parallel) add commits to either pass, so the figure is
// 2 give or take their share: the check wants at least 1.5. A crowd of 3
// waiters runs the crowd cases' path.
func TestServerWork(t *testing.T) {
	testenv.SkipShort(t, "postgres and redis")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg := bench.ShortConfig()
	cfg.NoBusy = true
	cfg.Waiters = []int{8, 3}
	cfg.Only = regexp.MustCompile(`^contended(-3)?/postgres/pg_advisory_lock|^contended-3/redis/redislock$`)
	r, err := bench.Run(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Down[bench.Postgres]; err != nil {
		testenv.Unavailable(t, bench.Postgres, err)
	}
	for _, p := range r.Problems() {
		t.Error(p)
	}
	work := r.ServerWork()
	t.Logf("server work per acquisition: %v", work)
	for _, k := range []string{"contended/idle/postgres/pg_advisory_lock (blocking)", "contended-3/idle/postgres/pg_advisory_lock (blocking)"} {
		if got, ok := work[k]; !ok || got < 1.5 {
			t.Errorf("%s: %.2f statements per acquisition (counted: %v), want about 2", k, got, ok)
		}
	}
	if r.Down[bench.Redis] == nil {
		if k := "contended-3/idle/redis/redislock"; work[k] <= 0 {
			t.Errorf("%s: %v calls per acquisition, want > 0", k, work[k])
		}
	}
	if testing.Verbose() {
		t.Log("\n" + r.Markdown())
	}
}
