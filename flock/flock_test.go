package flock_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/backend"
	"github.com/ubgo/lock/flock"
	"github.com/ubgo/lock/internal/testenv"
	"github.com/ubgo/lock/locktest"
)

func TestConformance(t *testing.T) {
	dir := t.TempDir()
	factory := func(t testing.TB, opts ...lock.Option) *flock.Factory {
		f := flock.NewFactory(append([]lock.Option{flock.WithDir(dir), flock.WithCheckInterval(20 * time.Millisecond), flock.WithLogger(nil)}, opts...)...)
		t.Cleanup(func() { f.Close() })
		return f
	}
	locktest.Run(t, locktest.Backend{
		// A factory per locker, as separate processes would have.
		New:         func(t testing.TB, opts ...lock.Option) lock.Locker { return factory(t).AsLocker(opts...) },
		ErrLocked:   flock.ErrLocked,
		ErrLockLost: flock.ErrLockLost,
		Wait:        true,
		Semaphore:   true,
		Shared:      true,
		Inspector:   func(t testing.TB) lock.Inspector { return factory(t) },
		Lister:      func(t testing.TB) lock.Lister { return factory(t) },
		// In production a lock is lost when its file is deleted behind
		// the library's back; the factory's check notices.
		Lose: func(t testing.TB, h lock.Holder) {
			if err := os.Remove(h.(*flock.Holder).Path()); err != nil {
				t.Fatal(err)
			}
		},
		LossBound: 5 * time.Second,
		Waiting:   func(name string) int { return flock.Waiting(dir, name) },
		// In order within a process, which the suite's waiters share.
		FIFO:       func(t testing.TB, opts ...lock.Option) lock.Locker { return factory(t).AsLocker(opts...) },
		NewFactory: func(t testing.TB, opts ...lock.Option) locktest.Factory { return factory(t, opts...) },
		TokenFile:  func(name string) string { return filepath.Join(dir, backend.Escape(name)+".lock") },
		Name:       "flock",
	})
}

func newFactory(t testing.TB, opts ...flock.Option) (*flock.Factory, string) {
	t.Helper()
	dir := t.TempDir()
	f := flock.NewFactory(append([]flock.Option{flock.WithDir(dir), flock.WithLogger(nil)}, opts...)...)
	t.Cleanup(func() { f.Close() })
	return f, dir
}

func mustAcquire(t testing.TB, f *flock.Factory, name string, opts ...flock.Option) *flock.Holder {
	t.Helper()
	h, err := f.Acquire(context.Background(), name, opts...)
	if err != nil {
		t.Fatalf("Acquire(%q): %v", name, err)
	}
	return h
}

// The seed's scenario 1, as written there.
func TestSingleLockForm(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "run", "myservice") // made on first use
	ctx := context.Background()
	fl := flock.New("nightly-import", flock.WithDir(dir))
	holder, err := fl.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(dir); err != nil || !st.IsDir() || st.Mode().Perm()&0o700 != 0o700 {
		t.Fatalf("WithDir did not create %s: %v %v", dir, st, err)
	}
	other := flock.New("nightly-import", flock.WithDir(dir))
	if _, err := other.Acquire(ctx); !errors.Is(err, flock.ErrLocked) || !errors.Is(err, lock.ErrLocked) {
		t.Fatalf("second Acquire = %v, want ErrLocked", err)
	}
	if err := holder.Release(); err != nil {
		t.Fatal(err)
	}
	h2, err := other.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if h2.Token() <= holder.Token() {
		t.Fatalf("token %d after %d", h2.Token(), holder.Token())
	}
	if got := h2.Path(); got != filepath.Join(dir, "nightly-import.lock") {
		t.Fatalf("Path = %s", got)
	}
	h2.Release()
	if err := fl.WithLock(ctx, func(context.Context) error { return nil }); err != nil {
		t.Fatal(err)
	}
}

func TestDefaultDir(t *testing.T) {
	if got, want := flock.NewFactory().Dir(), filepath.Join(os.TempDir(), "ubgo-lock"); got != want || flock.DefaultDir() != want {
		t.Fatalf("default dir %s, want %s", got, want)
	}
}

// Two Acquires of one name in one process conflict, through one factory
// or two, as two processes do.
func TestSameProcessConflicts(t *testing.T) {
	f, dir := newFactory(t)
	g := flock.NewFactory(flock.WithDir(dir))
	defer g.Close()
	h := mustAcquire(t, f, "x")
	for _, l := range []*flock.Factory{f, g} {
		if _, err := l.Acquire(context.Background(), "x"); !errors.Is(err, flock.ErrLocked) {
			t.Fatalf("Acquire while held = %v", err)
		}
	}
	h.Release()
	mustAcquire(t, g, "x").Release()
}

func TestTokensSurviveRestartAndLoss(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	var last uint64
	next := func(what string) {
		t.Helper()
		f := flock.NewFactory(flock.WithDir(dir)) // a fresh "process" each time
		defer f.Close()
		h, err := f.Acquire(ctx, "fence")
		if err != nil {
			t.Fatal(err)
		}
		if h.Token() <= last {
			t.Fatalf("%s: token %d after %d", what, h.Token(), last)
		}
		last = h.Token()
		h.Release()
	}
	next("first")
	next("restart")
	path := filepath.Join(dir, "fence.lock")
	b, err := os.ReadFile(path)
	if err != nil || !strings.Contains(string(b), fmt.Sprintf("token %d\n", last)) {
		t.Fatalf("lock file does not show the token %d:\n%s (%v)", last, b, err)
	}
	os.WriteFile(path, []byte("garbage"), 0o644)
	next("corrupt counter")
	os.Truncate(path, 0)
	next("empty counter")
	os.Remove(path)
	next("deleted counter")
}

func TestLimitMismatchBothWays(t *testing.T) {
	f, _ := newFactory(t)
	ctx := context.Background()
	m := mustAcquire(t, f, "mix")
	if _, err := f.Acquire(ctx, "mix", flock.WithMaxConcurrent(2)); !errors.Is(err, lock.ErrLimitMismatch) {
		t.Fatalf("semaphore Acquire over a held mutex = %v, want ErrLimitMismatch", err)
	}
	m.Release()
	s := mustAcquire(t, f, "mix", flock.WithMaxConcurrent(2))
	for _, opts := range [][]flock.Option{nil, {flock.WithWait()}} {
		if _, err := f.Acquire(ctx, "mix", opts...); !errors.Is(err, lock.ErrLimitMismatch) {
			t.Fatalf("mutex Acquire over a held semaphore = %v, want ErrLimitMismatch", err)
		}
	}
	if _, err := f.Acquire(ctx, "mix", flock.WithMaxConcurrent(3), flock.WithWait()); !errors.Is(err, lock.ErrLimitMismatch) {
		t.Fatalf("Acquire with limit 3 over limit 2 = %v, want ErrLimitMismatch", err)
	}
	s.Release()
	// Free again: any limit may start over.
	mustAcquire(t, f, "mix", flock.WithMaxConcurrent(3)).Release()
	mustAcquire(t, f, "mix").Release()
}

func TestSemaphoreFilesAndInspect(t *testing.T) {
	f, dir := newFactory(t, flock.WithMaxConcurrent(3))
	ctx := context.Background()
	a := mustAcquire(t, f, "indexer", flock.WithOwner("batch-1"), flock.WithMetadata("k", "v"))
	b := mustAcquire(t, f, "indexer")
	if a.Path() != filepath.Join(dir, "indexer.0.lock") || b.Path() != filepath.Join(dir, "indexer.1.lock") {
		t.Fatalf("slot files %s, %s", a.Path(), b.Path())
	}
	info, err := f.Inspect(ctx, "indexer")
	if err != nil {
		t.Fatal(err)
	}
	if info.Limit != 3 || len(info.Holders) != 2 {
		t.Fatalf("Inspect = %+v", info)
	}
	h0, h1 := info.Holders[0], info.Holders[1]
	if h0.Token != a.Token() || h0.Owner != "batch-1" || h0.Metadata["k"] != "v" || h0.Since.IsZero() {
		t.Errorf("first holder %+v", h0)
	}
	if h1.Token != b.Token() || !strings.HasPrefix(h1.ID, fmt.Sprint(os.Getpid())+"@") {
		t.Errorf("second holder %+v; want owner pid@host", h1)
	}
	a.Release()
	b.Release()
	if info, err := f.Inspect(ctx, "indexer"); err != nil || len(info.Holders) != 0 || info.Limit != 0 {
		t.Fatalf("Inspect after release = %+v, %v", info, err)
	}
	// A mutex shows its holder the same way.
	m := mustAcquire(t, f, "cron", flock.WithMaxConcurrent(1), flock.WithOwner("nightly"))
	info, err = f.Inspect(ctx, "cron")
	if err != nil || info.Limit != 1 || len(info.Holders) != 1 || info.Holders[0].Owner != "nightly" || info.Holders[0].Token != m.Token() {
		t.Fatalf("Inspect of a mutex = %+v, %v", info, err)
	}
	m.Release()
}

// Names map to files injectively and stay inside the directory.
func TestFileNames(t *testing.T) {
	f, dir := newFactory(t)
	parent := filepath.Dir(dir)
	before, _ := os.ReadDir(parent)
	names := []string{"a", "a/b", "a%2Fb", "../../escape", "x.0", "x.lock", "x:fence", "ünï ☃", strings.Repeat("L", 3000) + "1", strings.Repeat("L", 3000) + "2"}
	var hs []*flock.Holder
	for _, n := range names {
		hs = append(hs, mustAcquire(t, f, n))
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != len(names) {
		t.Fatalf("%d files for %d names", len(ents), len(names))
	}
	for _, e := range ents {
		if len(e.Name()) > 255 || strings.Count(e.Name(), ".") != 1 {
			t.Errorf("file name %q", e.Name())
		}
	}
	if after, _ := os.ReadDir(parent); len(after) != len(before) {
		t.Fatalf("a name escaped the directory: %v", after)
	}
	for _, h := range hs {
		h.Release()
	}
}

func TestBadOptions(t *testing.T) {
	dir := t.TempDir()
	for what, opt := range map[string]flock.Option{
		"WithSweepAfter(-1)":      flock.WithSweepAfter(-1),
		"WithCheckInterval(-1)":   flock.WithCheckInterval(-time.Second),
		"WithMaxConcurrent(>max)": flock.WithMaxConcurrent(flock.MaxPermits + 1),
		"WithMaxConcurrent(0)":    flock.WithMaxConcurrent(0),
		`WithDir("")`:             flock.WithDir(""),
	} {
		f := flock.NewFactory(flock.WithDir(dir), opt) // reported by the first Acquire
		if _, err := f.Acquire(context.Background(), "x"); !errors.Is(err, lock.ErrInvalidOption) {
			t.Errorf("NewFactory(%s).Acquire = %v, want ErrInvalidOption", what, err)
		}
		if _, err := flock.NewFactory(flock.WithDir(dir)).Acquire(context.Background(), "x", opt); !errors.Is(err, lock.ErrInvalidOption) {
			t.Errorf("Acquire(%s) = %v, want ErrInvalidOption", what, err)
		}
	}
	// Options flock has no use for are accepted.
	f, _ := newFactory(t)
	mustAcquire(t, f, "x", lock.WithTTL(time.Second), lock.WithAutoRenew(true), lock.WithKeyPrefix("p")).Release()
}

func TestUnwritableDir(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	os.WriteFile(file, nil, 0o644)
	f := flock.NewFactory(flock.WithDir(filepath.Join(file, "sub")))
	h, err := f.Acquire(context.Background(), "x")
	if err == nil || errors.Is(err, lock.ErrLocked) || h != nil {
		t.Fatalf("Acquire under a file = %v, %v; want a plain error", h, err)
	}
}

// A lock file deleted behind the holder's back is a lost lock: WithLock's
// context is cancelled, and a late Release frees nothing.
func TestDeletedFileIsLoss(t *testing.T) {
	f, _ := newFactory(t, flock.WithCheckInterval(10*time.Millisecond))
	err := f.WithLock(context.Background(), "gone", func(ctx context.Context) error {
		info, _ := f.Inspect(ctx, "gone")
		if len(info.Holders) != 1 {
			t.Errorf("Inspect = %+v", info)
		}
		os.Remove(filepath.Join(f.Dir(), "gone.lock"))
		<-ctx.Done()
		return ctx.Err()
	})
	if !errors.Is(err, flock.ErrLockLost) || !errors.Is(err, context.Canceled) {
		t.Fatalf("WithLock = %v", err)
	}
}

func TestLogs(t *testing.T) {
	var buf bytes.Buffer
	var mu sync.Mutex
	log := slog.New(slog.NewTextHandler(&lockedWriter{w: &buf, mu: &mu}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	f, _ := newFactory(t, flock.WithLogger(log), flock.WithCheckInterval(5*time.Millisecond))
	h := mustAcquire(t, f, "logged")
	os.Remove(h.Path())
	<-h.Done()
	var out string
	// The loss is logged just after Done closes.
	testenv.Eventually(t, time.Minute, "the loss logged", func() bool {
		mu.Lock()
		defer mu.Unlock()
		out = buf.String()
		return strings.Contains(out, "lock lost")
	})
	for _, want := range []string{"level=DEBUG msg=\"lock acquire\" backend=flock name=logged outcome=ok", "level=WARN msg=\"lock lost\" backend=flock name=logged outcome=lost"} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %q:\n%s", want, out)
		}
	}
}

type lockedWriter struct {
	w  *bytes.Buffer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func TestWaitReportsWaitTime(t *testing.T) {
	var waited atomic.Int64
	obs := lock.ObserverFunc(func(_ context.Context, e lock.Event) {
		if e.Op == lock.OpAcquire && e.Wait > 0 {
			waited.Store(int64(e.Wait))
		}
	})
	f, _ := newFactory(t, flock.WithObserver(obs))
	h := mustAcquire(t, f, "w")
	type result struct {
		h   *flock.Holder
		err error
	}
	done := make(chan result, 1)
	go func() {
		w, err := f.Acquire(context.Background(), "w", flock.WithWait())
		done <- result{w, err}
	}()
	waitForWaiters(t, f, "w", 1)
	h.Release()
	r := <-done
	if r.err != nil {
		t.Fatalf("waiting Acquire: %v", r.err)
	}
	r.h.Release()
	if waited.Load() == 0 {
		t.Fatal("no Wait reported for an Acquire that waited")
	}
}

// waitForWaiters returns once n Acquire calls of this process wait on
// name in f's directory.
func waitForWaiters(t testing.TB, f *flock.Factory, name string, n int) {
	t.Helper()
	testenv.Eventually(t, time.Minute, fmt.Sprintf("%d waiters on %q", n, name), func() bool {
		return flock.Waiting(f.Dir(), name) >= n
	})
}

func TestSweep(t *testing.T) {
	f, dir := newFactory(t)
	ctx := context.Background()
	var last uint64
	for _, n := range []string{"a", "b"} {
		h := mustAcquire(t, f, n)
		last = max(last, h.Token())
		h.Release()
	}
	s := mustAcquire(t, f, "sem", flock.WithMaxConcurrent(2))
	s.Release()
	held := mustAcquire(t, f, "held")
	os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("not ours"), 0o644)
	if n, err := f.Sweep(ctx, time.Hour); err != nil || n != 0 {
		t.Fatalf("Sweep of fresh files = %d, %v", n, err)
	}
	n, err := f.Sweep(ctx, 0)
	if err != nil || n != 3 {
		t.Fatalf("Sweep = %d, %v; want 3 names", n, err)
	}
	var left []string
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		left = append(left, e.Name())
	}
	if got := strings.Join(left, " "); got != "held.lock notes.txt ubgo-flock.fence ubgo-flock.sweep" {
		t.Fatalf("left after Sweep: %v", left)
	}
	held.Release()
	h := mustAcquire(t, f, "a")
	if h.Token() <= last {
		t.Fatalf("token after a sweep %d, not above %d", h.Token(), last)
	}
	h.Release()
}

// Goroutines churn one name while another sweeps its files as fast as it
// can: the sweeper's dead mark must keep holders of old and new files from
// overlapping.
func TestSweepChurnKeepsExclusion(t *testing.T) {
	f, _ := newFactory(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if testing.Short() {
		ctx, cancel = context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
	}
	var inside atomic.Int32
	var entered, swept atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var last uint64
			for ctx.Err() == nil {
				opts := []flock.Option{}
				if w%2 == 0 {
					opts = append(opts, flock.WithWait())
				}
				h, err := f.Acquire(ctx, "churn", opts...)
				if err != nil {
					continue
				}
				if n := inside.Add(1); n != 1 {
					t.Errorf("%d holders inside", n)
				}
				if h.Token() <= last {
					t.Errorf("token %d after %d", h.Token(), last)
				}
				last = h.Token()
				entered.Add(1)
				inside.Add(-1)
				h.Release()
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			n, _ := f.Sweep(context.Background(), 0)
			swept.Add(int64(n))
		}
	}()
	wg.Wait()
	t.Logf("%d critical sections, %d sweeps", entered.Load(), swept.Load())
	if entered.Load() == 0 || swept.Load() == 0 {
		t.Fatal("no churn")
	}
}

func openFDs(t *testing.T) int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("cannot count descriptors: %v", err)
	}
	return len(ents)
}

// After Release, after a wait that ran out, and after Close, no descriptor
// stays open, and a waiter that gave up holds nothing.
func TestNoDescriptorLeaks(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("counts /proc/self/fd")
	}
	dir := t.TempDir()
	f := flock.NewFactory(flock.WithDir(dir), flock.WithLogger(nil))
	ctx := context.Background()
	cycle := func() {
		mustAcquire(t, f, "m").Release()
		a := mustAcquire(t, f, "s", flock.WithMaxConcurrent(2))
		b := mustAcquire(t, f, "s", flock.WithMaxConcurrent(2))
		for _, opts := range [][]flock.Option{{flock.WithMaxConcurrent(2)}, nil} {
			name := map[bool]string{true: "s", false: "m"}[opts != nil]
			var h *flock.Holder
			if name == "m" {
				h = mustAcquire(t, f, "m")
			}
			wctx, cancel := context.WithTimeout(ctx, 30*time.Millisecond)
			if _, err := f.Acquire(wctx, name, append(opts, flock.WithWait())...); !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("wait on %s = %v", name, err)
			}
			cancel()
			if h != nil {
				h.Release()
				// The waiter that gave up did not take the lock on its way out.
				mustAcquire(t, f, "m").Release()
			}
		}
		a.Release()
		b.Release()
		f.Inspect(ctx, "s")
		f.Sweep(ctx, 0)
		f.WithLock(ctx, "w", func(context.Context) error { return nil })
	}
	settle := func(want int) int {
		n := 0
		testenv.Poll(10*time.Second, func() bool { n = openFDs(t); return n <= want })
		return n
	}
	cycle()
	testenv.Eventually(t, 10*time.Second, "the directory's watch retired", func() bool { return !flock.Watching(dir) })
	base := openFDs(t)
	for i := 0; i < 5; i++ {
		cycle()
	}
	h := mustAcquire(t, f, "held")
	f.Close()
	<-h.Done()
	if n := settle(base); n > base {
		t.Fatalf("%d descriptors open, %d before", n, base)
	}
}
