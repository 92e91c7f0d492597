//go:build unix

package filelock_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/backend"
	"github.com/ubgo/lock/filelock"
	"github.com/ubgo/lock/internal/testenv"
	"github.com/ubgo/lock/locktest"
	"golang.org/x/sys/unix"
)

// newFactory returns a factory on dir that is closed when t ends.
func newFactory(t testing.TB, opts ...filelock.Option) *filelock.Factory {
	f := filelock.NewFactory(opts...)
	t.Cleanup(func() { f.Close() })
	return f
}

func TestConformance(t *testing.T) {
	dir := t.TempDir()
	locktest.Run(t, locktest.Backend{
		// A factory per client, as separate processes would have.
		New: func(t testing.TB, opts ...lock.Option) lock.Locker {
			return newFactory(t, filelock.WithDir(dir), filelock.WithLogger(nil)).AsLocker(opts...)
		},
		ErrLocked:   filelock.ErrLocked,
		ErrLockLost: filelock.ErrLockLost,
		Wait:        true,
		Semaphore:   true,
		Extend:      true,
		Shared:      true,
		TTL:         300 * time.Millisecond,
		Inspector:   func(t testing.TB) lock.Inspector { return newFactory(t, filelock.WithDir(dir)) },
		Lister:      func(t testing.TB) lock.Lister { return newFactory(t, filelock.WithDir(dir)) },
		Lose: func(t testing.TB, h lock.Holder) {
			if err := unix.Unlink(h.(*filelock.Holder).Path()); err != nil {
				t.Fatal(err)
			}
		},
		Waiting: func(name string) int { return filelock.Waiting(dir, name) },
		// In order within a process, which the suite's waiters share.
		FIFO: func(t testing.TB, opts ...lock.Option) lock.Locker {
			return newFactory(t, filelock.WithDir(dir), filelock.WithLogger(nil)).AsLocker(opts...)
		},
		TokenFile: func(name string) string { return filepath.Join(dir, backend.Escape(name)+".token") },
		NewFactory: func(t testing.TB, opts ...lock.Option) locktest.Factory {
			return newFactory(t, append([]lock.Option{filelock.WithDir(dir), filelock.WithLogger(nil)}, opts...)...)
		},
		Breaker: func(t testing.TB) locktest.Breaker {
			return newFactory(t, filelock.WithDir(dir), filelock.WithLogger(nil))
		},
		Fence: func(testing.TB) lock.Fence { return filelock.NewFence(filelock.WithDir(dir)) },
		Name:  "filelock",
	})
}

// fields parses a marker file into its key=value lines.
func fields(t testing.TB, path string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			t.Fatalf("marker line %q is not key=value", line)
		}
		m[k] = v
	}
	return m
}

// template acquires and releases name once to learn the marker this
// process writes; tests edit it to plant other holders' markers.
func template(t testing.TB, dir, name string) map[string]string {
	t.Helper()
	f := newFactory(t, filelock.WithDir(dir), filelock.WithLogger(nil))
	h, err := f.Acquire(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	m := fields(t, h.Path())
	if err := h.Release(); err != nil {
		t.Fatal(err)
	}
	return m
}

// plant writes a marker with the template's fields changed by edits.
func plant(t testing.TB, path string, tmpl map[string]string, edits map[string]string) {
	t.Helper()
	var b strings.Builder
	for k, v := range tmpl {
		if e, ok := edits[k]; ok {
			v = e
		}
		fmt.Fprintf(&b, "%s=%s\n", k, v)
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
}

func ts(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

// deadPID returns the PID of a process that has exited and been reaped.
func deadPID(t testing.TB) int {
	t.Helper()
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	return cmd.Process.Pid
}

func mustLocked(t testing.TB, f *filelock.Factory, name string, opts ...filelock.Option) {
	t.Helper()
	h, err := f.Acquire(context.Background(), name, opts...)
	if err == nil {
		h.Release()
		t.Fatalf("Acquire(%q) succeeded; want ErrLocked", name)
	}
	if !errors.Is(err, filelock.ErrLocked) {
		t.Fatalf("Acquire(%q) = %v; want ErrLocked", name, err)
	}
}

func mustAcquire(t testing.TB, f *filelock.Factory, name string, opts ...filelock.Option) *filelock.Holder {
	t.Helper()
	h, err := f.Acquire(context.Background(), name, opts...)
	if err != nil {
		t.Fatalf("Acquire(%q): %v", name, err)
	}
	return h
}

func TestMarkerIsReadable(t *testing.T) {
	dir := t.TempDir()
	f := newFactory(t, filelock.WithDir(dir))
	h := mustAcquire(t, f, "stripe-event:evt_1",
		filelock.WithOwner("trace-42"),
		filelock.WithMetadata("job", "import"),
		filelock.WithMetadata("odd=key", "two\nlines"),
		filelock.WithStaleAfter(5*time.Minute))
	defer h.Release()
	if want := filepath.Join(dir, "stripe-event%3Aevt_1.lock"); h.Path() != want {
		t.Fatalf("Path = %s, want %s", h.Path(), want)
	}
	m := fields(t, h.Path())
	host, _ := os.Hostname()
	for k, want := range map[string]string{
		"name": "stripe-event:evt_1", "pid": strconv.Itoa(os.Getpid()), "host": host,
		"token": strconv.FormatUint(h.Token(), 10), "owner": "trace-42", "meta.job": "import",
		"stale_after": "5m0s", "limit": "1", "slot": "0",
	} {
		if m[k] != want {
			t.Errorf("marker %s = %q, want %q", k, m[k], want)
		}
	}
	// What could break the line format is written as a Go string literal.
	if raw, _ := os.ReadFile(h.Path()); !strings.Contains(string(raw), "\nmeta.\"odd=key\"=\"two\\nlines\"\n") {
		t.Errorf("marker does not quote an odd key and value:\n%s", raw)
	}
	for _, k := range []string{"nonce", "start", "acquired", "refreshed", "expires", "boot_id"} {
		if m[k] == "" {
			t.Errorf("marker has no %s", k)
		}
	}
	if len(m["nonce"]) != 32 {
		t.Errorf("nonce %q: want 128 random bits", m["nonce"])
	}
	info, err := f.Inspect(context.Background(), "stripe-event:evt_1")
	if err != nil || len(info.Holders) != 1 {
		t.Fatalf("Inspect = %+v, %v", info, err)
	}
	hi := info.Holders[0]
	if hi.Token != h.Token() || hi.ID != fmt.Sprintf("%d@%s", os.Getpid(), host) ||
		hi.Owner != "trace-42" || hi.Metadata["job"] != "import" || hi.Metadata["odd=key"] != "two\nlines" {
		t.Errorf("Inspect holder = %+v", hi)
	}
	if d := hi.Expires.Sub(hi.Since); d < 4*time.Minute || d > 6*time.Minute || info.Limit != 1 {
		t.Errorf("Inspect: since %v expires %v limit %d", hi.Since, hi.Expires, info.Limit)
	}
	// No temporary file is left beside the marker.
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".tmp") {
			t.Errorf("left behind: %s", e.Name())
		}
	}
}

// TestSemaphoreLayout: the seed's layout, <dir>/indexer.0.lock … .2.lock,
// in a directory WithDir creates.
func TestSemaphoreLayout(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "var", "run", "myservice")
	f := newFactory(t, filelock.WithDir(dir))
	var hs []*filelock.Holder
	for i := 0; i < 3; i++ {
		hs = append(hs, mustAcquire(t, f, "indexer", filelock.WithMaxConcurrent(3)))
	}
	mustLocked(t, f, "indexer", filelock.WithMaxConcurrent(3))
	for i, h := range hs {
		if want := filepath.Join(dir, fmt.Sprintf("indexer.%d.lock", i)); h.Path() != want {
			t.Errorf("permit %d at %s, want %s", i, h.Path(), want)
		}
		if fields(t, h.Path())["limit"] != "3" {
			t.Errorf("permit %d does not record the limit", i)
		}
	}
	info, err := f.Inspect(context.Background(), "indexer")
	if err != nil || info.Limit != 3 || len(info.Holders) != 3 {
		t.Fatalf("Inspect = %+v, %v", info, err)
	}
	hs[1].Release()
	h := mustAcquire(t, f, "indexer", filelock.WithMaxConcurrent(3))
	if h.Path() != hs[1].Path() {
		t.Errorf("freed slot not reused: %s", h.Path())
	}
	for _, h := range append(hs, h) {
		h.Release()
	}
	// Once nobody holds it, another limit may take the name.
	mustAcquire(t, f, "indexer").Release()
}

func TestDefaultDir(t *testing.T) {
	if got, want := filelock.DefaultDir(), filepath.Join(os.TempDir(), "ubgo-filelock"); got != want {
		t.Fatalf("DefaultDir = %s, want %s", got, want)
	}
	f := newFactory(t)
	name := fmt.Sprintf("filelock-test-%d-%d", os.Getpid(), time.Now().UnixNano())
	h := mustAcquire(t, f, name)
	if filepath.Dir(h.Path()) != filelock.DefaultDir() {
		t.Fatalf("marker at %s, want it in %s", h.Path(), filelock.DefaultDir())
	}
	h.Release()
	os.Remove(filepath.Join(filelock.DefaultDir(), name+".token"))
}

func TestNamesStayInDir(t *testing.T) {
	parent := t.TempDir()
	dir := filepath.Join(parent, "locks")
	f := newFactory(t, filelock.WithDir(dir))
	names := []string{"../../etc/passwd", "a/b", "a", "..", ".", "x.0", "x", "x.token", strings.Repeat("é", 300)}
	var hs []*filelock.Holder
	for _, n := range names {
		hs = append(hs, mustAcquire(t, f, n))
	}
	seen := map[string]bool{}
	for i, h := range hs {
		if filepath.Dir(h.Path()) != dir || seen[h.Path()] {
			t.Errorf("name %.20q mapped to %s", names[i], h.Path())
		}
		seen[h.Path()] = true
		if len(filepath.Base(h.Path())) > 255 {
			t.Errorf("name %.20q: file name too long", names[i])
		}
	}
	for _, h := range hs {
		h.Release()
	}
	if entries, _ := os.ReadDir(parent); len(entries) != 1 {
		t.Errorf("files outside the lock directory: %v", entries)
	}
}

func TestBadOptions(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	for _, tc := range []struct {
		what string
		f    *filelock.Factory
		opts []filelock.Option
	}{
		{"WithStaleAfter(10ms)", newFactory(t, filelock.WithDir(dir)), []filelock.Option{filelock.WithStaleAfter(10 * time.Millisecond)}},
		{"factory WithStaleAfter(1ms)", newFactory(t, filelock.WithDir(dir), filelock.WithStaleAfter(time.Millisecond)), nil},
		{"WithTTL(-1)", newFactory(t, filelock.WithDir(dir)), []filelock.Option{filelock.WithTTL(-1)}},
		{"WithDir(\"\")", newFactory(t, filelock.WithDir("")), nil},
		{"WithMaxConcurrent(0)", newFactory(t, filelock.WithDir(dir)), []filelock.Option{filelock.WithMaxConcurrent(0)}},
	} {
		if h, err := tc.f.Acquire(ctx, "x", tc.opts...); !errors.Is(err, lock.ErrInvalidOption) {
			if h != nil {
				h.Release()
			}
			t.Errorf("%s: Acquire = %v; want ErrInvalidOption", tc.what, err)
		}
	}
	// A directory that cannot be created is a clear error.
	file := filepath.Join(dir, "file")
	os.WriteFile(file, nil, 0o644)
	if _, err := newFactory(t, filelock.WithDir(filepath.Join(file, "sub"))).Acquire(ctx, "x"); err == nil {
		t.Error("Acquire in a directory under a regular file succeeded")
	}
}

// TestStaleWindow: a marker from another host is respected until its lease
// runs out, then taken over with a larger token.
func TestStaleWindow(t *testing.T) {
	dir := t.TempDir()
	f := newFactory(t, filelock.WithDir(dir), filelock.WithLogger(nil))
	tmpl := template(t, dir, "job")
	path := filepath.Join(dir, "job.lock")
	high := strconv.FormatUint(1<<62, 10)
	plant(t, path, tmpl, map[string]string{"host": "other-host", "pid": "1", "nonce": "theirs", "token": high, "expires": ts(time.Now().Add(time.Hour))})
	mustLocked(t, f, "job")
	info, _ := f.Inspect(context.Background(), "job")
	if len(info.Holders) != 1 || info.Holders[0].ID != "1@other-host" {
		t.Fatalf("Inspect = %+v", info)
	}
	plant(t, path, tmpl, map[string]string{"host": "other-host", "pid": "1", "nonce": "theirs", "token": high, "expires": ts(time.Now().Add(-time.Second))})
	info, _ = f.Inspect(context.Background(), "job")
	if len(info.Holders) != 0 {
		t.Fatalf("Inspect lists a stale marker: %+v", info)
	}
	h := mustAcquire(t, f, "job")
	defer h.Release()
	if h.Token() <= 1<<62 {
		t.Errorf("token %d after taking over token %s", h.Token(), high)
	}
}

// TestProbe: same-host markers are judged by the holder process.
func TestProbe(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("no /proc: same-host probe unavailable")
	}
	dir := t.TempDir()
	f := newFactory(t, filelock.WithDir(dir), filelock.WithLogger(nil))
	tmpl := template(t, dir, "p")
	path := filepath.Join(dir, "p.lock")
	later := ts(time.Now().Add(time.Hour))
	start, err := time.Parse(time.RFC3339Nano, tmpl["start"])
	if err != nil {
		t.Fatal(err)
	}
	ticks, err := strconv.ParseUint(tmpl["start_ticks"], 10, 64)
	if err != nil {
		t.Fatalf("start_ticks %q: %v", tmpl["start_ticks"], err)
	}
	for _, tc := range []struct {
		what  string
		edits map[string]string
		live  bool
	}{
		{"live process", map[string]string{}, true},
		{"live process, start time 1s off", map[string]string{"start": ts(start.Add(time.Second))}, true},
		{"dead process", map[string]string{"pid": strconv.Itoa(deadPID(t))}, false},
		{"live process, start time 1h off (a clock step)", map[string]string{"start": ts(start.Add(-time.Hour))}, true},
		{"reused PID", map[string]string{"start_ticks": strconv.FormatUint(ticks+1, 10)}, false},
		{"older marker (no start ticks), start time 1h off", map[string]string{"start_ticks": "", "start": ts(start.Add(-time.Hour))}, true},
		{"older marker (no start ticks), dead process", map[string]string{"start_ticks": "", "pid": strconv.Itoa(deadPID(t))}, false},
		{"dead process, other boot", map[string]string{"pid": strconv.Itoa(deadPID(t)), "boot_id": "another-boot"}, true},
		{"dead process, other PID namespace", map[string]string{"pid": strconv.Itoa(deadPID(t)), "pid_ns": "pid:[1]"}, true},
		{"dead process, other host", map[string]string{"pid": strconv.Itoa(deadPID(t)), "host": "elsewhere"}, true},
		{"no start time", map[string]string{"start": "", "start_ticks": ""}, true},
	} {
		edits := map[string]string{"nonce": "planted", "expires": later}
		maps.Copy(edits, tc.edits)
		plant(t, path, tmpl, edits)
		h, err := f.Acquire(context.Background(), "p")
		switch {
		case tc.live && err == nil:
			t.Errorf("%s: marker taken over", tc.what)
		case tc.live && !errors.Is(err, filelock.ErrLocked):
			t.Errorf("%s: Acquire = %v, want ErrLocked", tc.what, err)
		case !tc.live && err != nil:
			t.Errorf("%s: Acquire = %v, want the marker reclaimed", tc.what, err)
		}
		if h != nil {
			h.Release()
		}
		os.Remove(path)
	}
}

func TestCorruptMarker(t *testing.T) {
	dir := t.TempDir()
	f := newFactory(t, filelock.WithDir(dir), filelock.WithLogger(nil), filelock.WithStaleAfter(time.Minute))
	path := filepath.Join(dir, "c.lock")
	os.WriteFile(path, []byte("garbage"), 0o644)
	mustLocked(t, f, "c")
	old := time.Now().Add(-2 * time.Minute)
	os.Chtimes(path, old, old)
	mustAcquire(t, f, "c").Release()
}

// TestTokensNeverRestartLow: a deleted or damaged counter file gives a token
// from the clock floor, above every earlier one.
func TestTokensNeverRestartLow(t *testing.T) {
	dir := t.TempDir()
	f := newFactory(t, filelock.WithDir(dir))
	counter := filepath.Join(dir, "t.token")
	var last uint64
	next := func(what string) {
		t.Helper()
		h := mustAcquire(t, f, "t")
		if h.Token() <= last {
			t.Fatalf("%s: token %d after %d", what, h.Token(), last)
		}
		last = h.Token()
		h.Release()
	}
	for i := 0; i < 3; i++ {
		next("fresh")
	}
	if b, _ := os.ReadFile(counter); !strings.Contains(string(b), "token="+strconv.FormatUint(last, 10)+"\n") {
		t.Fatalf("counter file %q does not hold the last token %d", b, last)
	}
	os.Remove(counter)
	next("after the counter was deleted")
	os.WriteFile(counter, []byte("token=5\nlimit=1\ncrc=00000000\n"), 0o644)
	next("after the counter was corrupted")
	os.WriteFile(counter, []byte("tok"), 0o644)
	next("after the counter was truncated")
	next("after the counter was rewritten")
	// A counter that went back (restored from a backup) cannot undercut a
	// live marker's token either.
	h := mustAcquire(t, f, "t", filelock.WithMaxConcurrent(2))
	os.Remove(counter)
	h2 := mustAcquire(t, f, "t", filelock.WithMaxConcurrent(2))
	if h2.Token() <= h.Token() {
		t.Fatalf("token %d after %d", h2.Token(), h.Token())
	}
	h.Release()
	h2.Release()
}

// TestLateReleaseAfterTakeover: a holder whose marker was taken over loses
// the lock and its Release frees nothing.
func TestLateReleaseAfterTakeover(t *testing.T) {
	dir := t.TempDir()
	f := newFactory(t, filelock.WithDir(dir), filelock.WithLogger(nil))
	h := mustAcquire(t, f, "late")
	tmpl := fields(t, h.Path())
	plant(t, h.Path(), tmpl, map[string]string{"nonce": "successor"})
	if err := h.Release(); !errors.Is(err, filelock.ErrLockLost) {
		t.Fatalf("late Release = %v; want ErrLockLost", err)
	}
	if fields(t, h.Path())["nonce"] != "successor" {
		t.Fatal("late Release removed the successor's marker")
	}
	if err := h.Extend(context.Background()); !errors.Is(err, lock.ErrLockLost) {
		t.Fatalf("Extend after loss = %v", err)
	}
	mustLocked(t, f, "late")
}

// TestTakeoverNoticed: the factory's loop closes Done when the marker is
// taken over, without anyone calling Release.
func TestTakeoverNoticed(t *testing.T) {
	dir := t.TempDir()
	f := newFactory(t, filelock.WithDir(dir), filelock.WithLogger(nil))
	h := mustAcquire(t, f, "n", filelock.WithStaleAfter(time.Second))
	plant(t, h.Path(), fields(t, h.Path()), map[string]string{"nonce": "successor"})
	select {
	case <-h.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("takeover not noticed")
	}
	if !errors.Is(h.Err(), filelock.ErrLockLost) {
		t.Fatalf("Err = %v", h.Err())
	}
	if fields(t, h.Path())["nonce"] != "successor" {
		t.Fatal("the loser removed the successor's marker")
	}
}

func TestExtendRefreshesMarker(t *testing.T) {
	dir := t.TempDir()
	f := newFactory(t, filelock.WithDir(dir))
	h := mustAcquire(t, f, "e", filelock.WithStaleAfter(time.Minute))
	defer h.Release()
	before := fields(t, h.Path())
	time.Sleep(5 * time.Millisecond)
	if err := h.Extend(context.Background()); err != nil {
		t.Fatal(err)
	}
	after := fields(t, h.Path())
	if after["expires"] <= before["expires"] || after["refreshed"] <= before["refreshed"] {
		t.Fatalf("Extend did not move the lease: %s → %s", before["expires"], after["expires"])
	}
	if after["acquired"] != before["acquired"] || after["nonce"] != before["nonce"] || after["token"] != before["token"] {
		t.Fatal("Extend changed the holder's identity")
	}
}

// TestAutoRenew: inside WithLock a marker outlives several stale windows.
func TestAutoRenew(t *testing.T) {
	dir := t.TempDir()
	f := newFactory(t, filelock.WithDir(dir))
	other := newFactory(t, filelock.WithDir(dir))
	// A window of 1 s, refreshed every third of it: a refresh may be late
	// by most of a window on a loaded machine and the lock still holds. (A
	// 200 ms window was lost once under a load of 8 on two cores.)
	err := f.WithLock(context.Background(), "r", func(ctx context.Context) error {
		time.Sleep(3500 * time.Millisecond) // over three windows
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		mustLocked(t, other, "r")
		return nil
	}, filelock.WithStaleAfter(time.Second))
	if err != nil {
		t.Fatal(err)
	}
}

func TestSweep(t *testing.T) {
	dir := t.TempDir()
	f := newFactory(t, filelock.WithDir(dir), filelock.WithLogger(nil))
	tmpl := template(t, dir, "tmpl")
	later := ts(time.Now().Add(time.Hour))
	plant(t, filepath.Join(dir, "dead.lock"), tmpl, map[string]string{"nonce": "a", "pid": strconv.Itoa(deadPID(t)), "expires": later})
	plant(t, filepath.Join(dir, "expired.1.lock"), tmpl, map[string]string{"nonce": "b", "host": "elsewhere", "expires": ts(time.Now().Add(-time.Minute))})
	plant(t, filepath.Join(dir, "remote.lock"), tmpl, map[string]string{"nonce": "c", "host": "elsewhere", "expires": later})
	os.WriteFile(filepath.Join(dir, "crashed.0123456789abcdef.tmp"), []byte("half a mark"), 0o644)
	old := time.Now().Add(-2 * time.Minute)
	os.Chtimes(filepath.Join(dir, "crashed.0123456789abcdef.tmp"), old, old)
	os.WriteFile(filepath.Join(dir, "writing.0123456789abcdef.tmp"), []byte("in flight"), 0o644)
	os.WriteFile(filepath.Join(dir, "README"), []byte("not ours"), 0o644)
	live := mustAcquire(t, f, "live")
	defer live.Release()

	// idle: stale markers written within the last hour stay, and so does
	// a temporary file of two minutes; one written two hours ago goes.
	if n, err := f.Sweep(context.Background(), time.Hour); n != 0 || err != nil {
		t.Fatalf("Sweep(1h) of young markers = %d, %v; want 0, nil", n, err)
	}
	older := time.Now().Add(-2 * time.Hour)
	os.Chtimes(filepath.Join(dir, "dead.lock"), older, older)
	if n, err := f.Sweep(context.Background(), time.Hour); n != 1 || err != nil {
		t.Fatalf("Sweep(1h) = %d, %v; want the marker idle for 2h", n, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "crashed.0123456789abcdef.tmp")); err != nil {
		t.Fatalf("Sweep(1h) removed a temporary file of 2 minutes: %v", err)
	}

	n, err := f.Sweep(context.Background(), 0)
	if err != nil || n != 1 {
		t.Fatalf("Sweep = %d, %v; want the other stale marker reclaimed", n, err)
	}
	for file, want := range map[string]bool{
		"dead.lock": false, "expired.1.lock": false, "crashed.0123456789abcdef.tmp": false,
		"remote.lock": true, "live.lock": true, "README": true, "writing.0123456789abcdef.tmp": true,
	} {
		if _, err := os.Stat(filepath.Join(dir, file)); (err == nil) != want {
			t.Errorf("after Sweep, %s exists = %v, want %v", file, err == nil, want)
		}
	}
	if live.Err() != nil {
		t.Fatal("Sweep took a live lock")
	}
	if n, err := f.Sweep(context.Background(), 0); n != 0 || err != nil {
		t.Fatalf("second Sweep = %d, %v", n, err)
	}
}

// TestSweepDuringAcquires: sweeping while goroutines hammer a name never
// lets two in at once.
func TestSweepDuringAcquires(t *testing.T) {
	dir := t.TempDir()
	var inside atomic.Int32
	ctx, cancel := context.WithTimeout(context.Background(), 600*time.Millisecond)
	defer cancel()
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		f := newFactory(t, filelock.WithDir(dir), filelock.WithLogger(nil))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				h, err := f.Acquire(ctx, "s", filelock.WithWait(), filelock.WithStaleAfter(100*time.Millisecond))
				if err != nil {
					continue
				}
				if inside.Add(1) != 1 {
					t.Error("two holders inside")
				}
				time.Sleep(time.Millisecond)
				inside.Add(-1)
				h.Release()
			}
		}()
	}
	f := newFactory(t, filelock.WithDir(dir), filelock.WithLogger(nil))
	for ctx.Err() == nil {
		if _, err := f.Sweep(context.Background(), 0); err != nil {
			t.Error(err)
		}
	}
	wg.Wait()
}

// Close removes its holders' markers, of plain and of renewed holders,
// and stops what it started. The rest of Close is locktest's.
func TestCloseRemovesMarkers(t *testing.T) {
	dir := t.TempDir()
	base := runtime.NumGoroutine()
	f := filelock.NewFactory(filelock.WithDir(dir), filelock.WithLogger(nil))
	h := mustAcquire(t, f, "c")
	r, err := f.AsLocker().Acquire(context.Background(), "r") // refreshed by the factory's loop
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	for _, h := range []lock.Holder{h, r} {
		if !errors.Is(h.Err(), lock.ErrClosed) {
			t.Fatalf("holder after Close: %v; want ErrClosed", h.Err())
		}
		if _, err := os.Stat(h.(*filelock.Holder).Path()); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("marker left after Close: %v", err)
		}
	}
	testenv.Eventually(t, 5*time.Second, fmt.Sprintf("the goroutines after Close back to %d", base), func() bool {
		return runtime.NumGoroutine() <= base
	})
}
