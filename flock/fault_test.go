//go:build unix

package flock_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/flock"
	"github.com/ubgo/lock/internal/testenv"
)

// TestChild is the body of the child processes the fault tests start by
// running this test binary again; in a normal run it skips.
func TestChild(t *testing.T) {
	switch role := testenv.Child(); role {
	case "":
		t.Skip("runs only as a child process of the fault tests")
	case "hold":
		childHold()
	case "hammer":
		childHammer(t)
	case "wait":
		childWait()
	default:
		t.Fatalf("unknown child role %q", role)
	}
}

// childHold acquires FLOCK_NAME, says so, holds it until its stdin
// closes, then releases it.
func childHold() {
	limit, _ := strconv.Atoi(os.Getenv("FLOCK_LIMIT"))
	l := flock.New(os.Getenv("FLOCK_NAME"), flock.WithDir(os.Getenv("FLOCK_DIR")), flock.WithMaxConcurrent(max(limit, 1)), flock.WithOwner("child"))
	var opts []flock.Option
	if os.Getenv("FLOCK_SHARED") != "" {
		opts = append(opts, flock.WithShared())
	}
	h, err := l.Acquire(context.Background(), opts...)
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	fmt.Println("acquired", h.Token())
	io.Copy(io.Discard, os.Stdin)
	if err := h.Release(); err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	fmt.Println("released", time.Now().UnixNano())
}

// childWait waits for FLOCK_NAME, says when it waits and when it got it,
// and releases it.
func childWait() {
	l := flock.New(os.Getenv("FLOCK_NAME"), flock.WithDir(os.Getenv("FLOCK_DIR")), flock.WithLogger(nil))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	go func() {
		if testenv.Poll(time.Minute, func() bool { return flock.Waiting(os.Getenv("FLOCK_DIR"), os.Getenv("FLOCK_NAME")) > 0 }) {
			fmt.Println("waiting")
		}
	}()
	h, err := l.Acquire(ctx, flock.WithWait())
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	fmt.Println("acquired", h.Token(), time.Now().UnixNano())
	h.Release()
}

type child struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines *bufio.Scanner
}

func startHolder(t *testing.T, dir, name string, env ...string) (*child, uint64) {
	t.Helper()
	cmd := testenv.Command(t, "hold", "TestChild", append(env, "FLOCK_DIR="+dir, "FLOCK_NAME="+name)...)
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &child{cmd: cmd, stdin: stdin, lines: bufio.NewScanner(stdout)}
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGCONT)
		cmd.Process.Kill()
		cmd.Wait()
	})
	line := c.line(t)
	tok, ok := strings.CutPrefix(line, "acquired ")
	token, err := strconv.ParseUint(tok, 10, 64)
	if !ok || err != nil {
		t.Fatalf("child: %q", line)
	}
	return c, token
}

func (c *child) line(t *testing.T) string {
	t.Helper()
	got := make(chan string, 1)
	go func() {
		if c.lines.Scan() {
			got <- c.lines.Text()
		}
		close(got)
	}()
	select {
	case l, ok := <-got:
		if !ok {
			t.Fatalf("child ended: %v", c.lines.Err())
		}
		return l
	case <-time.After(60 * time.Second):
		t.Fatal("child said nothing for 60s")
	}
	return ""
}

func quietFactory(t *testing.T, dir string, opts ...flock.Option) *flock.Factory {
	f := flock.NewFactory(append([]flock.Option{flock.WithDir(dir), flock.WithLogger(nil)}, opts...)...)
	t.Cleanup(func() { f.Close() })
	return f
}

// A holder killed with SIGKILL frees the lock at once: as soon as the
// process is gone, a non-waiting Acquire succeeds, and a waiter that was
// already waiting gets the lock.
func TestKilledHolderFreesAtOnce(t *testing.T) {
	dir := t.TempDir()
	f := quietFactory(t, dir)
	ctx := context.Background()

	c, token := startHolder(t, dir, "job")
	if _, err := f.Acquire(ctx, "job"); !errors.Is(err, flock.ErrLocked) {
		t.Fatalf("Acquire while a child holds = %v", err)
	}
	info, err := f.Inspect(ctx, "job")
	if err != nil || len(info.Holders) != 1 || info.Holders[0].Token != token || info.Holders[0].Owner != "child" {
		t.Fatalf("Inspect = %+v, %v", info, err)
	}
	c.cmd.Process.Kill()
	c.cmd.Wait()
	h, err := f.Acquire(ctx, "job") // no retry: the kernel freed it
	if err != nil {
		t.Fatalf("Acquire right after the holder was killed: %v", err)
	}
	if h.Token() <= token {
		t.Fatalf("token %d after the child's %d", h.Token(), token)
	}
	h.Release()

	// The same with a waiter in place, woken by the kill.
	c, token = startHolder(t, dir, "job")
	got := make(chan error, 1)
	go func() {
		wctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		h, err := f.Acquire(wctx, "job", flock.WithWait())
		if err == nil {
			if h.Token() <= token {
				err = fmt.Errorf("token %d after the child's %d", h.Token(), token)
			}
			h.Release()
		}
		got <- err
	}()
	waitForWaiters(t, f, "job", 1)
	c.cmd.Process.Kill()
	if err := <-got; err != nil {
		t.Fatalf("waiter after the holder was killed: %v", err)
	}

	// A killed permit holder frees its permit.
	c, _ = startHolder(t, dir, "pool", "FLOCK_LIMIT=2")
	if _, err := f.Acquire(ctx, "pool", flock.WithMaxConcurrent(3)); !errors.Is(err, lock.ErrLimitMismatch) {
		t.Fatalf("limit 3 against a child's limit 2 = %v", err)
	}
	p1 := mustAcquire(t, f, "pool", flock.WithMaxConcurrent(2))
	if _, err := f.Acquire(ctx, "pool", flock.WithMaxConcurrent(2)); !errors.Is(err, flock.ErrLocked) {
		t.Fatalf("third permit of 2 = %v", err)
	}
	c.cmd.Process.Kill()
	c.cmd.Wait()
	mustAcquire(t, f, "pool", flock.WithMaxConcurrent(2)).Release()
	p1.Release()
}

// A shared holder killed with SIGKILL frees its share at once, and a
// writer killed while it waits (holding the want file that keeps new
// readers out) lets readers in at once.
func TestKilledSharedHolderAndWaitingWriter(t *testing.T) {
	dir := t.TempDir()
	f := quietFactory(t, dir)
	ctx := context.Background()

	c, token := startHolder(t, dir, "schema", "FLOCK_SHARED=1")
	r := mustAcquire(t, f, "schema", flock.WithShared()) // beside the child
	if _, err := f.Acquire(ctx, "schema"); !errors.Is(err, flock.ErrLocked) {
		t.Fatalf("exclusive Acquire beside two readers = %v", err)
	}
	r.Release()
	c.cmd.Process.Kill()
	c.cmd.Wait()
	h := mustAcquire(t, f, "schema") // no retry: the kernel freed the share
	if h.Token() <= max(token, r.Token()) {
		t.Fatalf("writer's token %d after readers' %d and %d", h.Token(), token, r.Token())
	}
	h.Release()

	// A writer in another process waits behind a reader, then is killed.
	r = mustAcquire(t, f, "schema", flock.WithShared())
	w := testenv.Command(t, "wait", "TestChild", "FLOCK_DIR="+dir, "FLOCK_NAME=schema")
	stdout, _ := w.StdoutPipe()
	w.Stderr = os.Stderr
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Process.Kill(); w.Wait() })
	wc := &child{cmd: w, lines: bufio.NewScanner(stdout)}
	if l := wc.line(t); l != "waiting" {
		t.Fatalf("waiting writer: %q", l)
	}
	if _, err := f.Acquire(ctx, "schema", flock.WithShared()); !errors.Is(err, flock.ErrLocked) {
		t.Fatalf("a new reader while a writer waits = %v; want ErrLocked (writer preference)", err)
	}
	w.Process.Kill()
	w.Wait()
	mustAcquire(t, f, "schema", flock.WithShared()).Release() // no retry: the kernel freed the want file
	r.Release()
}

// A stopped holder keeps the lock: others get ErrLocked and waits run out.
// Once it continues and releases, a waiter gets the lock.
func TestStoppedHolderKeepsLock(t *testing.T) {
	dir := t.TempDir()
	f := quietFactory(t, dir)
	ctx := context.Background()
	c, token := startHolder(t, dir, "paused")
	if err := c.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Acquire(ctx, "paused"); !errors.Is(err, flock.ErrLocked) {
		t.Fatalf("Acquire while the holder is stopped = %v", err)
	}
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	_, err := f.Acquire(short, "paused", flock.WithWait())
	cancel()
	if !errors.Is(err, flock.ErrLocked) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("wait on a stopped holder = %v", err)
	}
	got := make(chan error, 1)
	var acquiredAt time.Time
	go func() {
		wctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		h, err := f.Acquire(wctx, "paused", flock.WithWait())
		acquiredAt = time.Now()
		if err == nil {
			if h.Token() <= token {
				err = fmt.Errorf("token %d after %d", h.Token(), token)
			}
			h.Release()
		}
		got <- err
	}()
	waitForWaiters(t, f, "paused", 1)
	time.Sleep(50 * time.Millisecond)
	select {
	case err := <-got:
		t.Fatalf("the waiter returned while the holder was stopped: %v", err)
	default:
	}
	c.cmd.Process.Signal(syscall.SIGCONT)
	c.stdin.Close() // the child releases and exits
	l := c.line(t)
	releasedNs, err := strconv.ParseInt(strings.TrimPrefix(l, "released "), 10, 64)
	if err != nil {
		t.Fatalf("child: %q", l)
	}
	if err := <-got; err != nil {
		t.Fatalf("waiter after the holder released: %v", err)
	}
	// Informational: the wake-up latency across processes (no assertion).
	t.Logf("the waiter got the lock %v after the other process released it", acquiredAt.Sub(time.Unix(0, releasedNs)))
	if err := c.cmd.Wait(); err != nil {
		t.Fatalf("child: %v", err)
	}
}

// A release wakes a waiter in another process: on Linux through the
// inotify event of its close, elsewhere through the waiter's poll.
func TestReleaseWakesWaiterInOtherProcess(t *testing.T) {
	dir := t.TempDir()
	f := quietFactory(t, dir)
	h := mustAcquire(t, f, "x")
	cmd := testenv.Command(t, "wait", "TestChild", "FLOCK_DIR="+dir, "FLOCK_NAME=x")
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	c := &child{cmd: cmd, lines: bufio.NewScanner(stdout)}
	if l := c.line(t); l != "waiting" {
		t.Fatalf("child: %q", l)
	}
	released := time.Now()
	h.Release()
	var token uint64
	var at int64
	if l := c.line(t); !strings.HasPrefix(l, "acquired ") {
		t.Fatalf("child: %q", l)
	} else if _, err := fmt.Sscan(strings.TrimPrefix(l, "acquired "), &token, &at); err != nil || token <= h.Token() {
		t.Fatalf("child: %q (%v), token not above %d", l, err, h.Token())
	}
	// Informational: the wake-up latency across processes (no assertion).
	t.Logf("the waiter got the lock %v after the release", time.Unix(0, at).Sub(released))
	if err := cmd.Wait(); err != nil {
		t.Fatalf("child: %v", err)
	}
}

// childHammer takes FLOCK_NAME over and over until FLOCK_UNTIL, logging
// each critical section to FLOCK_LOG and holding an exclusively created
// sentinel file while inside. FLOCK_MODE=naive swaps in the classic broken
// protocol (close, then unlink) to show that the checks catch it.
func childHammer(t *testing.T) {
	dir, name := os.Getenv("FLOCK_DIR"), os.Getenv("FLOCK_NAME")
	until, _ := strconv.ParseInt(os.Getenv("FLOCK_UNTIL"), 10, 64)
	logf, err := os.OpenFile(os.Getenv("FLOCK_LOG"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	limit, _ := strconv.Atoi(os.Getenv("FLOCK_LIMIT"))
	kind := os.Getenv("FLOCK_KIND") // FLOCK_MODE=shared: "r" a reader, "w" a writer
	pid := os.Getpid()
	// One sentinel per slot: a permit's holder is alone in its slot. A
	// reader only looks for a writer's.
	inside := func(token uint64, slot string) {
		sentinel := os.Getenv("FLOCK_SENTINEL") + "." + slot
		if kind == "r" {
			if _, err := os.Stat(sentinel); err == nil {
				fmt.Fprintf(logf, "overlap %d %d %s\n", pid, token, kind)
			}
			fmt.Fprintf(logf, "enter %d %d %s\n", pid, token, kind)
			time.Sleep(time.Duration(rand.IntN(300)) * time.Microsecond)
			fmt.Fprintf(logf, "exit %d %d %s\n", pid, token, kind)
			return
		}
		if s, err := os.OpenFile(sentinel, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644); err != nil {
			fmt.Fprintf(logf, "overlap %d %d%s\n", pid, token, suffix(kind))
		} else {
			s.Close()
		}
		fmt.Fprintf(logf, "enter %d %d%s\n", pid, token, suffix(kind))
		for i := rand.IntN(3); i > 0; i-- {
			time.Sleep(time.Duration(rand.IntN(100)) * time.Microsecond)
		}
		fmt.Fprintf(logf, "exit %d %d%s\n", pid, token, suffix(kind))
		os.Remove(sentinel)
	}
	f := flock.NewFactory(flock.WithDir(dir), flock.WithLogger(nil), flock.WithMaxConcurrent(max(limit, 1)))
	ctx := context.Background()
	n := 0
	for i := 0; time.Now().UnixNano() < until; i++ {
		if os.Getenv("FLOCK_MODE") == "naive" {
			naiveSection(filepath.Join(dir, name+".lock"), func(token uint64) { inside(token, "lock") })
			n++
			continue
		}
		var opts []flock.Option
		if kind == "r" {
			opts = append(opts, flock.WithShared())
		}
		actx, cancel := ctx, context.CancelFunc(func() {})
		if i%3 == 0 {
			opts = append(opts, flock.WithWait())
			actx, cancel = context.WithTimeout(ctx, 200*time.Millisecond)
		}
		h, err := f.Acquire(actx, name, opts...)
		cancel()
		switch {
		case err == nil:
			inside(h.Token(), filepath.Base(h.Path()))
			if err := h.Release(); err != nil {
				t.Fatal(err)
			}
			n++
		case errors.Is(err, lock.ErrLocked):
			time.Sleep(time.Duration(rand.IntN(300)) * time.Microsecond)
		default:
			t.Fatal(err)
		}
		if i%4 == 0 {
			// Unlink churn: remove the name's file whenever it is free.
			if _, err := f.Sweep(ctx, 0); err != nil {
				t.Fatal(err)
			}
		}
	}
	fmt.Println("sections", n)
}

func suffix(kind string) string {
	if kind == "" {
		return ""
	}
	return " " + kind
}

// naiveSection is the classic broken protocol this package must not
// follow: lock, work, close, unlink.
func naiveSection(path string, inside func(uint64)) {
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_CLOEXEC, 0o644)
	if err != nil {
		return
	}
	if unix.Flock(fd, unix.LOCK_EX) == nil {
		inside(uint64(time.Now().UnixNano()))
	}
	unix.Close(fd)
	unix.Unlink(path)
}

// hammer runs n child processes on one name (a semaphore if limit > 1)
// for d and returns how many critical sections they completed and what the
// log shows was wrong.
func hammer(t *testing.T, mode string, n, limit int, d time.Duration) (int, []string) {
	dir := t.TempDir()
	logPath := filepath.Join(dir, "log")
	until := time.Now().Add(d).UnixNano()
	var children []*exec.Cmd
	var outs []*strings.Builder
	for i := 0; i < n; i++ {
		kind := ""
		if mode == "shared" {
			kind = "r" // a third writers, the rest readers
			if i%3 == 0 {
				kind = "w"
			}
		}
		cmd := testenv.Command(t, "hammer", "TestChild",
			"FLOCK_DIR="+filepath.Join(dir, "locks"), "FLOCK_NAME=hot", "FLOCK_LOG="+logPath,
			"FLOCK_SENTINEL="+filepath.Join(dir, "inside"), "FLOCK_MODE="+mode, "FLOCK_LIMIT="+strconv.Itoa(limit),
			"FLOCK_UNTIL="+strconv.FormatInt(until, 10), "FLOCK_KIND="+kind)
		out := &strings.Builder{}
		cmd.Stdout, cmd.Stderr = out, out
		if mode == "naive" {
			os.MkdirAll(filepath.Join(dir, "locks"), 0o755)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		children = append(children, cmd)
		outs = append(outs, out)
	}
	sections := 0
	for i, cmd := range children {
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("child %d: %v\n%s", i, err, outs[i])
			}
		case <-time.After(d + 90*time.Second):
			cmd.Process.Kill()
			t.Fatalf("child %d did not finish", i)
		}
		for _, l := range strings.Split(outs[i].String(), "\n") {
			if v, ok := strings.CutPrefix(l, "sections "); ok {
				k, _ := strconv.Atoi(v)
				sections += k
			}
		}
	}
	b, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatal(err)
	}
	if mode == "shared" {
		return sections, checkSharedLog(string(b))
	}
	return sections, checkLog(string(b), limit, mode != "naive")
}

// checkSharedLog verifies a log of readers (r) and writers (w): a writer
// enters only when nobody is inside, a reader only when no writer is; a
// writer's token is above every token entered before it, a reader's above
// every writer's before it; tokens are unique.
func checkSharedLog(log string) []string {
	var bad []string
	open := map[string]string{} // "pid token" -> kind
	seen := map[string]bool{}
	var maxTok, maxWriter uint64
	writers := func() (n int) {
		for _, k := range open {
			if k == "w" {
				n++
			}
		}
		return n
	}
	for _, l := range strings.Split(strings.TrimSpace(log), "\n") {
		f := strings.Fields(l)
		if len(f) != 4 {
			bad = append(bad, "malformed: "+l)
			continue
		}
		id, kind := f[1]+" "+f[2], f[3]
		tok, _ := strconv.ParseUint(f[2], 10, 64)
		switch f[0] {
		case "overlap":
			bad = append(bad, "a writer's sentinel present on entry: "+l)
		case "enter":
			switch {
			case kind == "w" && len(open) > 0:
				bad = append(bad, fmt.Sprintf("writer %s entered with %d inside", id, len(open)))
			case kind == "r" && writers() > 0:
				bad = append(bad, fmt.Sprintf("reader %s entered beside a writer", id))
			}
			if seen[f[2]] {
				bad = append(bad, "token handed out twice: "+f[2])
			}
			seen[f[2]] = true
			if kind == "w" && tok <= maxTok || kind == "r" && tok <= maxWriter {
				bad = append(bad, fmt.Sprintf("%s token %d after %d (last writer's %d)", kind, tok, maxTok, maxWriter))
			}
			open[id] = kind
			maxTok = max(maxTok, tok)
			if kind == "w" {
				maxWriter = tok
			}
		case "exit":
			if _, ok := open[id]; !ok {
				bad = append(bad, "exit without its enter: "+l)
			}
			delete(open, id)
		}
	}
	return bad
}

// checkLog verifies that critical sections never overlapped beyond limit:
// the log is written inside the sections, so at no point may more than
// limit entries be open; every exit closes an open enter; no sentinel was
// found in place; tokens are unique and, for a mutex, increase.
func checkLog(log string, limit int, tokens bool) []string {
	var bad []string
	open := map[string]bool{} // "pid token" of sections entered and not left
	seen := map[string]bool{}
	var last uint64
	for _, l := range strings.Split(strings.TrimSpace(log), "\n") {
		f := strings.Fields(l)
		if len(f) != 3 {
			bad = append(bad, "malformed: "+l)
			continue
		}
		id := f[1] + " " + f[2]
		switch f[0] {
		case "overlap":
			bad = append(bad, "sentinel present on entry: "+l)
		case "enter":
			if open[id] = true; len(open) > limit {
				bad = append(bad, fmt.Sprintf("enter %s with %d inside (limit %d)", id, len(open), limit))
			}
			if !tokens {
				continue
			}
			if seen[f[2]] {
				bad = append(bad, "token handed out twice: "+f[2])
			}
			seen[f[2]] = true
			tok, _ := strconv.ParseUint(f[2], 10, 64)
			if limit == 1 && tok <= last {
				bad = append(bad, fmt.Sprintf("token %d after %d", tok, last))
			}
			last = max(last, tok)
		case "exit":
			if !open[id] {
				bad = append(bad, "exit without its enter: "+l)
			}
			delete(open, id)
		}
	}
	return bad
}

// Four processes take one name over and over, with its file swept
// (unlinked) whenever it is free, and never overlap.
func TestProcessesNeverOverlap(t *testing.T) {
	d := 3 * time.Second
	if testing.Short() {
		d = time.Second
	}
	sections, bad := hammer(t, "flock", 4, 1, d)
	t.Logf("%d critical sections in %v", sections, d)
	if len(bad) > 0 {
		t.Fatalf("%d violations, first: %s", len(bad), strings.Join(bad[:min(len(bad), 10)], "\n"))
	}
	if sections < 20 {
		t.Fatalf("only %d critical sections: no churn to speak of", sections)
	}
}

// Four processes share a semaphore of 2, with sweeping churn: never more
// than two inside, never two in one slot.
func TestProcessesSemaphoreNeverOverAdmit(t *testing.T) {
	d := 2 * time.Second
	if testing.Short() {
		d = time.Second
	}
	sections, bad := hammer(t, "flock", 4, 2, d)
	t.Logf("%d critical sections in %v", sections, d)
	if len(bad) > 0 {
		t.Fatalf("%d violations, first: %s", len(bad), strings.Join(bad[:min(len(bad), 10)], "\n"))
	}
	if sections < 20 {
		t.Fatalf("only %d critical sections: no churn to speak of", sections)
	}
}

// Six processes, two writers and four readers, take one name over and
// over with sweeping churn: a writer is never inside beside anyone, tokens
// order readers after writers and writers after everyone.
func TestProcessesSharedNeverOverlap(t *testing.T) {
	d := 3 * time.Second
	if testing.Short() {
		d = time.Second
	}
	sections, bad := hammer(t, "shared", 6, 1, d)
	t.Logf("%d critical sections in %v", sections, d)
	if len(bad) > 0 {
		t.Fatalf("%d violations, first: %s", len(bad), strings.Join(bad[:min(len(bad), 10)], "\n"))
	}
	if sections < 20 {
		t.Fatalf("only %d critical sections: no churn to speak of", sections)
	}
}

// The same harness catches the classic close-then-unlink race, which shows
// it would catch that race in flock too.
func TestHammerCatchesNaiveUnlink(t *testing.T) {
	d := 2 * time.Second
	if testing.Short() {
		d = time.Second
	}
	for round := 1; ; round++ {
		sections, bad := hammer(t, "naive", 4, 1, d)
		if len(bad) > 0 {
			t.Logf("round %d: the naive protocol overlapped %d times in %d sections; first: %s", round, len(bad), sections, bad[0])
			return
		}
		if round == 3 {
			t.Fatalf("the naive protocol ran %d sections without an overlap being detected", sections)
		}
	}
}
