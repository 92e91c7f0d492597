package flock

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ubgo/lock/backend"
	"github.com/ubgo/lock/internal/testenv"
)

func TestRecordRoundTrip(t *testing.T) {
	in := record{limit: 3, token: 1<<62 + 5, pid: 42, host: "h\nst", since: time.Unix(0, 123), owner: "job \"7\"", meta: map[string]string{"b": "2", "a": "x y\n"}}
	dir := t.TempDir()
	p := filepath.Join(dir, "r")
	fd, err := sysOpen(p, true, true)
	if err != nil {
		t.Fatal(err)
	}
	defer sysClose(fd)
	// A longer record first: the shorter one written over it must not
	// pick up its tail.
	long := record{token: 9, owner: strings.Repeat("o", 5000)}
	if err := writeRecord(fd, &long); err != nil {
		t.Fatal(err)
	}
	got, ok, err := readRecord(fd)
	if err != nil || !ok || got.owner != long.owner {
		t.Fatalf("long record: ok=%v err=%v", ok, err)
	}
	if err := writeRecord(fd, &in); err != nil {
		t.Fatal(err)
	}
	got, ok, err = readRecord(fd)
	if err != nil || !ok {
		t.Fatalf("readRecord: ok=%v err=%v", ok, err)
	}
	if got.limit != in.limit || got.token != in.token || got.pid != in.pid || got.host != in.host ||
		!got.since.Equal(in.since) || got.owner != in.owner || len(got.meta) != 2 || got.meta["a"] != "x y\n" || got.dead {
		t.Fatalf("round trip: got %+v, want %+v", got, in)
	}
}

func TestRecordRejectsDamage(t *testing.T) {
	r := record{limit: 1, token: 77}
	good := r.encode()
	for name, b := range map[string][]byte{
		"empty":     nil,
		"garbage":   []byte("hello world\n"),
		"truncated": good[:len(good)-3],
		"flipped":   append(append([]byte{}, good[:len(good)-3]...), 'X', good[len(good)-2], good[len(good)-1]),
		"huge":      []byte(recordMagic + "999999999 00000000\n"),
		"bad field": withHeader("limit -1\ntoken 5\n"),
		"bad meta":  withHeader("token 5\nmeta \"k\"\"v\"\n"),
		"no value":  withHeader("token\n"),
	} {
		p := filepath.Join(t.TempDir(), "r")
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		fd, err := sysOpen(p, false, false)
		if err != nil {
			t.Fatal(err)
		}
		if got, ok, err := readRecord(fd); ok || err != nil {
			t.Errorf("%s: readRecord = %+v, %v, %v; want not ok", name, got, ok, err)
		}
		sysClose(fd)
	}
}

// withHeader is body behind a valid header: checksummed, but not
// necessarily a valid record.
func withHeader(body string) []byte {
	return fmt.Appendf(nil, "%s%d %08x\n%s", recordMagic, len(body), crc32.ChecksumIEEE([]byte(body)), body)
}

func TestSplitFile(t *testing.T) {
	for file, want := range map[string][2]string{
		"abc.lock":       {"abc", "lock"},
		"abc.0.lock":     {"abc", "slot"},
		"abc.12.lock":    {"abc", "slot"},
		"abc.guard":      {"abc", "guard"},
		"a%2Fb~ff.lock":  {"a%2Fb~ff", "lock"},
		"abc.x.lock":     {},
		"abc.lock.tmp":   {},
		".lock":          {},
		"abc":            {},
		"abc.0.guard":    {},
		"notes.txt":      {},
		"abc.-1.lock":    {},
		"abc..lock":      {},
		"abc.0.lock.bak": {},
	} {
		esc, kind, ok := splitFile(file)
		if ok != (want[0] != "") || esc != want[0] || kind != want[1] {
			t.Errorf("splitFile(%q) = %q, %q, %v; want %q", file, esc, kind, ok, want)
		}
	}
}

// A counter ahead of the clock (the clock stepped back) is still obeyed.
func TestCounterAheadOfClock(t *testing.T) {
	dir := t.TempDir()
	f := NewFactory(WithDir(dir))
	defer f.Close()
	ctx := context.Background()
	h, err := f.Acquire(ctx, "ahead")
	if err != nil {
		t.Fatal(err)
	}
	h.Release()
	future := uint64(time.Now().Add(time.Hour).UnixNano())
	fd, err := sysOpen(filepath.Join(dir, "ahead.lock"), true, false)
	if err != nil {
		t.Fatal(err)
	}
	if err := writeRecord(fd, &record{limit: 1, token: future}); err != nil {
		t.Fatal(err)
	}
	sysClose(fd)
	for i := uint64(1); i <= 3; i++ {
		h, err := f.Acquire(ctx, "ahead")
		if err != nil {
			t.Fatal(err)
		}
		if h.Token() != future+i {
			t.Fatalf("token %d, want %d", h.Token(), future+i)
		}
		h.Release()
	}
}

// A sweeper that died between marking a file dead and unlinking it leaves
// the dead file at the path; the next acquirer finishes the job.
func TestDeadFileLeftBySweeper(t *testing.T) {
	dir := t.TempDir()
	f := NewFactory(WithDir(dir))
	defer f.Close()
	ctx := context.Background()
	for _, limit := range []int{1, 2} {
		name := "dead" + string(rune('0'+limit))
		p := filepath.Join(dir, backend.Escape(name)+".lock")
		fd, err := sysOpen(p, true, true)
		if err != nil {
			t.Fatal(err)
		}
		if err := writeRecord(fd, &record{dead: true, token: 5, limit: limit}); err != nil {
			t.Fatal(err)
		}
		// Keep it open, so its inode number is not reused by the new file.
		old, _ := os.Open(p)
		st1, _ := old.Stat()
		sysClose(fd)
		h, err := f.Acquire(ctx, name, WithMaxConcurrent(limit))
		old.Close()
		if err != nil {
			t.Fatalf("limit %d: %v", limit, err)
		}
		st2, err := os.Stat(p)
		if err != nil || os.SameFile(st1, st2) {
			t.Fatalf("limit %d: the dead file was reused (err %v)", limit, err)
		}
		h.Release()
	}
}

// A swept name's counter is gone, but the directory's fence keeps its
// next token above the last one even when the counter ran ahead of the
// clock.
func TestSweepKeepsTokensAboveFence(t *testing.T) {
	dir := t.TempDir()
	f := NewFactory(WithDir(dir))
	defer f.Close()
	ctx := context.Background()
	future := uint64(time.Now().Add(time.Hour).UnixNano())
	for _, name := range []string{"m", "s"} {
		limit := map[string]int{"m": 1, "s": 2}[name]
		h, err := f.Acquire(ctx, name, WithMaxConcurrent(limit))
		if err != nil {
			t.Fatal(err)
		}
		h.Release()
		fd, err := sysOpen(filepath.Join(dir, name+".lock"), true, false)
		if err != nil {
			t.Fatal(err)
		}
		if err := writeRecord(fd, &record{limit: limit, token: future}); err != nil {
			t.Fatal(err)
		}
		sysClose(fd)
	}
	if n, err := f.Sweep(ctx, 0); n != 2 || err != nil {
		t.Fatalf("Sweep = %d, %v", n, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "m.lock")); !os.IsNotExist(err) {
		t.Fatalf("m.lock not swept: %v", err)
	}
	for _, name := range []string{"m", "s", "never-used"} {
		limit := map[string]int{"m": 1, "s": 2, "never-used": 1}[name]
		h, err := f.Acquire(ctx, name, WithMaxConcurrent(limit))
		if err != nil {
			t.Fatal(err)
		}
		if h.Token() <= future {
			t.Fatalf("%s: token %d after a sweep, not above the swept %d", name, h.Token(), future)
		}
		h.Release()
	}
}

// Two sweepers list a semaphore at once. The first removes its files; a
// permit holder then makes new ones. The second, locking the unlinked file
// it opened before, must not remove the new generation's slot files: a
// third acquirer would create a fresh slot 0 beside the held one and get
// in over the limit.
func TestSweepLateSweeperLeavesNewGeneration(t *testing.T) {
	dir := t.TempDir()
	f := NewFactory(WithDir(dir), WithMaxConcurrent(2))
	defer f.Close()
	ctx := context.Background()
	h, err := f.Acquire(ctx, "s")
	if err != nil {
		t.Fatal(err)
	}
	h.Release()
	late, err := sysOpen(filepath.Join(dir, "s.lock"), true, false) // the second sweeper's open
	if err != nil {
		t.Fatal(err)
	}
	defer sysClose(late)
	if n, err := f.Sweep(ctx, 0); n != 1 || err != nil { // the first sweeper
		t.Fatalf("Sweep = %d, %v", n, err)
	}
	var held []*Holder
	for range 2 {
		h, err := f.Acquire(ctx, "s")
		if err != nil {
			t.Fatal(err)
		}
		defer h.Release()
		held = append(held, h)
	}
	if ok, err := removeName(newCall(dir, "s"), late, &nameFiles{hasLock: true}, 0); ok || err != nil {
		t.Fatalf("late sweep of an unlinked file = %v, %v; want nothing done", ok, err)
	}
	for _, h := range held {
		if same, err := sysSameFile(h.slotFd, h.slotPath); err != nil || !same {
			t.Fatalf("%s of a live permit was removed (%v)", h.slotPath, err)
		}
	}
	if h, err := f.Acquire(ctx, "s"); !errors.Is(err, ErrLocked) {
		if h != nil {
			h.Release()
		}
		t.Fatalf("third permit of a limit of 2: %v", err)
	}
}

// Acquire starts a background sweep only with WithSweepAfter.
func TestAutoSweepIsOptIn(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	f := NewFactory(WithDir(dir), WithLogger(nil))
	defer f.Close()
	take := func(name string, opts ...Option) {
		t.Helper()
		h, err := f.Acquire(ctx, name, opts...)
		if err != nil {
			t.Fatal(err)
		}
		h.Release()
	}
	take("old")
	old := filepath.Join(dir, "old.lock")
	lastUse := time.Now().Add(-2 * time.Hour)
	if err := os.Chtimes(old, lastUse, lastUse); err != nil {
		t.Fatal(err)
	}
	// autoSweep schedules the next sweep before it starts one.
	scheduled := func() bool {
		sweeps.Lock()
		defer sweeps.Unlock()
		_, ok := sweeps.next[dir]
		return ok
	}
	for _, opts := range [][]Option{nil, {WithSweepAfter(0)}} {
		if take("new", opts...); scheduled() {
			t.Fatalf("Acquire with %d options started a sweep", len(opts))
		}
	}
	if take("new", WithSweepAfter(time.Hour)); !scheduled() {
		t.Fatal("Acquire with WithSweepAfter started no sweep")
	}
	testenv.Eventually(t, time.Minute, "the background sweep removing old.lock, idle for 2h", func() bool {
		_, err := os.Stat(old)
		return os.IsNotExist(err)
	})
	if _, err := os.Stat(filepath.Join(dir, "new.lock")); err != nil {
		t.Fatalf("the background sweep removed new.lock, just used: %v", err)
	}
}
