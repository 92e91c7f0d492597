//go:build linux

package filelock_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/filelock"
	"github.com/ubgo/lock/internal/testenv"
)

// The fault tests run this test binary again as child processes that hold,
// hammer or race for locks, and kill or stop them for real. A child writes
// "@@ "-prefixed lines on stdout and ends when its stdin closes.

func TestChild(t *testing.T) {
	role := testenv.Child()
	if role == "" {
		t.Skip("runs only as a child process of the fault tests")
	}
	dir, name := os.Getenv("FILELOCK_DIR"), os.Getenv("FILELOCK_NAME")
	ttl, _ := time.ParseDuration(os.Getenv("FILELOCK_TTL"))
	if ttl == 0 {
		ttl = filelock.DefaultStaleAfter
	}
	f := filelock.NewFactory(filelock.WithDir(dir), filelock.WithStaleAfter(ttl), filelock.WithLogger(nil))
	defer f.Close()
	stdinClosed := make(chan struct{})
	go func() { io.Copy(io.Discard, os.Stdin); close(stdinClosed) }()
	say := func(format string, args ...any) { fmt.Printf("@@ "+format+"\n", args...) }
	ctx := context.Background()

	var opts []filelock.Option
	if os.Getenv("FILELOCK_SHARED") != "" {
		opts = append(opts, filelock.WithShared())
	}
	if os.Getenv("FILELOCK_WAIT") != "" {
		opts = append(opts, filelock.WithWait())
	}

	switch role {
	case "hold":
		// Hold name, refreshed in the background, until stdin closes
		// (FILELOCK_SHARED: shared; FILELOCK_WAIT: waiting for it).
		h, err := f.AsLocker(opts...).Acquire(ctx, name)
		if err != nil {
			say("ERR %v", err)
			return
		}
		say("ACQUIRED %d", h.Token())
		select {
		case <-h.Done():
			say("LOST %v", h.Err())
			<-stdinClosed
		case <-stdinClosed:
			if err := h.Release(); err != nil {
				say("ERR release: %v", err)
			}
		}

	case "hammer":
		// Take name again and again for a while; a file created with
		// O_EXCL inside the critical section catches any overlap, and an
		// append-only log records the tokens in the order they entered.
		d, _ := time.ParseDuration(os.Getenv("FILELOCK_FOR"))
		inside, logPath := filepath.Join(dir, "inside"), filepath.Join(dir, "entries")
		logf, err := os.OpenFile(logPath, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
		if err != nil {
			say("ERR %v", err)
			return
		}
		defer logf.Close()
		n := 0
		for end := time.Now().Add(d); time.Now().Before(end); n++ {
			h, err := f.Acquire(ctx, name, filelock.WithWait())
			if err != nil {
				say("ERR %v", err)
				return
			}
			mark, err := os.OpenFile(inside, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
			if err != nil {
				say("OVERLAP %v", err)
			} else {
				mark.Close()
			}
			fmt.Fprintf(logf, "%d %d\n", h.Token(), os.Getpid())
			time.Sleep(200 * time.Microsecond)
			if err == nil {
				os.Remove(inside)
			}
			if err := h.Release(); err != nil {
				say("ERR release: %v", err)
				return
			}
		}
		say("COUNT %d", n)

	case "race":
		// At agreed instants, try once for each of a series of names whose
		// markers are stale; keep whatever is won until stdin closes.
		t0, _ := strconv.ParseInt(os.Getenv("FILELOCK_T0"), 10, 64)
		rounds, _ := strconv.Atoi(os.Getenv("FILELOCK_ROUNDS"))
		var won []*filelock.Holder
		for r := 0; r < rounds; r++ {
			time.Sleep(time.Until(time.Unix(0, t0).Add(time.Duration(r) * 15 * time.Millisecond)))
			h, err := f.Acquire(ctx, fmt.Sprintf("%s-%d", name, r))
			switch {
			case err == nil:
				won = append(won, h)
				say("WON %d %d", r, h.Token())
			case errors.Is(err, filelock.ErrLocked):
				say("LOCKED %d", r)
			default:
				say("ERR %d %v", r, err)
			}
		}
		say("DONE")
		<-stdinClosed
		for _, h := range won {
			h.Release()
		}

	case "guard":
		// Hold the guard of name, as a process stopped inside one of the
		// guard's few syscalls would, until stdin closes.
		fd, err := unix.Open(filepath.Join(dir, name+".token"), unix.O_RDWR|unix.O_CREAT|unix.O_CLOEXEC, 0o644)
		if err == nil {
			err = unix.Flock(fd, unix.LOCK_EX)
		}
		if err != nil {
			say("ERR %v", err)
			return
		}
		say("GUARDED")
		<-stdinClosed

	case "try":
		// Try once for name and say whether it was won.
		h, err := f.Acquire(ctx, name)
		switch {
		case err == nil:
			say("WON %d", h.Token())
			h.Release()
		case errors.Is(err, filelock.ErrLocked):
			say("LOCKED")
		default:
			say("ERR %v", err)
		}

	default:
		t.Fatalf("unknown child role %q", role)
	}
}

type child struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan string
}

func startChild(t *testing.T, role string, env ...string) *child {
	t.Helper()
	return startChildVia(t, nil, role, env...)
}

// startChildVia starts the child through the command line via (unshare,
// nsenter …), which runs the test binary with its arguments.
func startChildVia(t *testing.T, via []string, role string, env ...string) *child {
	t.Helper()
	cmd := testenv.Command(t, role, "TestChild", env...)
	if len(via) > 0 {
		path, err := exec.LookPath(via[0])
		if err != nil {
			t.Skipf("%s: %v", via[0], err)
		}
		cmd.Path, cmd.Args = path, append(slices.Clone(via), cmd.Args...)
	}
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &child{cmd: cmd, stdin: stdin, lines: make(chan string, 1024)}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if l, ok := strings.CutPrefix(sc.Text(), "@@ "); ok {
				c.lines <- l
			}
		}
		close(c.lines)
	}()
	t.Cleanup(func() {
		c.cmd.Process.Kill()
		c.cmd.Wait()
	})
	return c
}

// expect returns the child's next line, which must start with prefix.
func (c *child) expect(t *testing.T, prefix string) string {
	t.Helper()
	select {
	case l, ok := <-c.lines:
		if !ok {
			t.Fatalf("child %d ended; want %q", c.cmd.Process.Pid, prefix)
		}
		if !strings.HasPrefix(l, prefix) {
			t.Fatalf("child said %q; want %q", l, prefix)
		}
		return l
	case <-time.After(60 * time.Second):
		t.Fatalf("child %d did not say %q", c.cmd.Process.Pid, prefix)
	}
	return ""
}

func tokenOf(t *testing.T, line string) uint64 {
	t.Helper()
	f := strings.Fields(line)
	tok, err := strconv.ParseUint(f[len(f)-1], 10, 64)
	if err != nil {
		t.Fatalf("no token in %q", line)
	}
	return tok
}

// waitState blocks until the child has exited (not reaping it) or stopped.
func (c *child) waitState(t *testing.T, options int) {
	t.Helper()
	var info unix.Siginfo
	for {
		err := unix.Waitid(unix.P_PID, c.cmd.Process.Pid, &info, options|unix.WNOWAIT, nil)
		if err != unix.EINTR {
			if err != nil {
				t.Fatal(err)
			}
			return
		}
	}
}

// procState is the state letter of /proc/<pid>/stat.
func procState(t *testing.T, pid int) string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	return strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))[0]
}

// stopOutsideGuard stops the child with SIGSTOP at a moment it does not hold
// the name's guard (a process stopped inside the guard's few syscalls
// blocks the name until it continues — a documented limit, not what this
// test is about).
func (c *child) stopOutsideGuard(t *testing.T, guard string) {
	t.Helper()
	pid := c.cmd.Process.Pid
	testenv.Eventually(t, 30*time.Second, "the child stopped outside the guard", func() bool {
		testenv.Pause(t, c.cmd.Process)
		fd, err := unix.Open(guard, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		err = unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB)
		unix.Close(fd)
		if err == nil {
			return true
		}
		c.cmd.Process.Signal(syscall.SIGCONT)
		testenv.Eventually(t, 10*time.Second, "the child running again", func() bool { return procState(t, pid) != "T" })
		return false
	})
}

// awaitWaiter returns once an Acquire of this process waits on name: it
// found the name held and subscribed to its wake-ups.
func awaitWaiter(t *testing.T, dir, name string) {
	t.Helper()
	testenv.Eventually(t, 10*time.Second, "an Acquire of "+name+" waiting", func() bool {
		return filelock.Waiting(dir, name) > 0
	})
}

func dirEnv(dir, name string) []string {
	return []string{"FILELOCK_DIR=" + dir, "FILELOCK_NAME=" + name}
}

// TestKilledHolderReclaimedAtOnce: a holder killed with SIGKILL leaves its
// marker behind, and the next Acquire on the host takes it at once — while
// the dead holder is still a zombie, after it is reaped, and for a waiter
// already waiting when it died. Its stale window (1h) plays no part.
func TestKilledHolderReclaimedAtOnce(t *testing.T) {
	dir := t.TempDir()
	f := newFactory(t, filelock.WithDir(dir), filelock.WithLogger(nil))
	env := append(dirEnv(dir, "nightly-import"), "FILELOCK_TTL=1h")

	// Zombie: exited, not yet reaped.
	c := startChild(t, "hold", env...)
	tok := tokenOf(t, c.expect(t, "ACQUIRED"))
	mustLocked(t, f, "nightly-import")
	c.cmd.Process.Signal(syscall.SIGKILL)
	c.waitState(t, unix.WEXITED)
	if _, err := os.Stat(filepath.Join(dir, "nightly-import.lock")); err != nil {
		t.Fatalf("the killed holder's marker should still be there: %v", err)
	}
	h := mustAcquire(t, f, "nightly-import")
	if h.Token() <= tok {
		t.Fatalf("token %d after the dead holder's %d", h.Token(), tok)
	}
	h.Release()
	c.cmd.Wait()

	// Reaped.
	c = startChild(t, "hold", env...)
	c.expect(t, "ACQUIRED")
	c.cmd.Process.Kill()
	c.cmd.Wait()
	mustAcquire(t, f, "nightly-import").Release()

	// A waiter already waiting is served once the holder dies.
	c = startChild(t, "hold", env...)
	c.expect(t, "ACQUIRED")
	got := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		h, err := f.Acquire(ctx, "nightly-import", filelock.WithWait())
		if err == nil {
			h.Release()
		}
		got <- err
	}()
	awaitWaiter(t, dir, "nightly-import")
	c.cmd.Process.Kill()
	if err := <-got; err != nil {
		t.Fatalf("waiter after the holder died: %v", err)
	}
}

// TestKilledSharedHolderReclaimedAtOnce: shared holders killed with
// SIGKILL leave their reader markers behind, and a writer on the host
// takes the name at once when the last is dead, whatever their stale
// window (1h); one that survives keeps the writer out. A writer killed
// while it waits leaves its intent behind, and new readers are let in at
// once.
func TestKilledSharedHolderReclaimedAtOnce(t *testing.T) {
	dir := t.TempDir()
	f := newFactory(t, filelock.WithDir(dir), filelock.WithLogger(nil))
	env := append(dirEnv(dir, "schema"), "FILELOCK_TTL=1h")
	shared := append(slices.Clone(env), "FILELOCK_SHARED=1")

	a, b := startChild(t, "hold", shared...), startChild(t, "hold", shared...)
	ta, tb := tokenOf(t, a.expect(t, "ACQUIRED")), tokenOf(t, b.expect(t, "ACQUIRED"))
	mustLocked(t, f, "schema")
	mustAcquire(t, f, "schema", filelock.WithShared()).Release()
	a.cmd.Process.Signal(syscall.SIGKILL)
	a.waitState(t, unix.WEXITED)
	mustLocked(t, f, "schema") // b still reads
	b.cmd.Process.Signal(syscall.SIGKILL)
	b.waitState(t, unix.WEXITED)
	if ms, _ := filepath.Glob(filepath.Join(dir, "schema.[01].lock")); len(ms) == 0 {
		t.Fatal("the last killed reader's marker should still be there")
	}
	h := mustAcquire(t, f, "schema")
	if h.Token() <= max(ta, tb) {
		t.Fatalf("writer's token %d after the dead readers' %d and %d", h.Token(), ta, tb)
	}
	h.Release()

	// A writer that dies while it waits: its intent goes with it.
	r := mustAcquire(t, f, "schema", filelock.WithShared())
	w := startChild(t, "hold", append(env, "FILELOCK_WAIT=1")...)
	want := filepath.Join(dir, "schema.want")
	testenv.Eventually(t, 30*time.Second, "the waiting writer's intent", func() bool {
		_, err := os.Stat(want)
		return err == nil
	})
	mustLocked(t, f, "schema", filelock.WithShared()) // writer preference
	w.cmd.Process.Signal(syscall.SIGKILL)
	w.waitState(t, unix.WEXITED)
	mustAcquire(t, f, "schema", filelock.WithShared()).Release()
	if _, err := os.Stat(want); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the dead writer's intent was not reclaimed: %v", err)
	}
	r.Release()
}

// TestStoppedHolderKeepsLock: a holder stopped with SIGSTOP is alive, so its
// lock holds until its stale window runs out; then another process takes
// over, and the stopped holder, once continued, learns it lost the lock and
// does not touch its successor's marker.
func TestStoppedHolderKeepsLock(t *testing.T) {
	dir := t.TempDir()
	const ttl = 3 * time.Second
	f := newFactory(t, filelock.WithDir(dir), filelock.WithLogger(nil))
	c := startChild(t, "hold", append(dirEnv(dir, "export"), "FILELOCK_TTL="+ttl.String())...)
	tok := tokenOf(t, c.expect(t, "ACQUIRED"))
	c.stopOutsideGuard(t, filepath.Join(dir, "export.token"))
	// Its last refresh was at most ttl/3 ago: the window is still open.
	mustLocked(t, f, "export")

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	h, err := f.Acquire(ctx, "export", filelock.WithWait(), filelock.WithStaleAfter(time.Minute))
	if err != nil {
		t.Fatalf("waiting for the stopped holder's window: %v", err)
	}
	if h.Token() <= tok {
		t.Fatalf("token %d after %d", h.Token(), tok)
	}
	c.cmd.Process.Signal(syscall.SIGCONT)
	if l := c.expect(t, "LOST"); !strings.Contains(l, "lock lost") {
		t.Fatalf("continued holder said %q", l)
	}
	if err := h.Extend(ctx); err != nil {
		t.Fatalf("the continued holder disturbed the new one: %v", err)
	}
	c.stdin.Close()
	if err := c.cmd.Wait(); err != nil {
		t.Fatalf("child: %v", err)
	}
	if err := h.Release(); err != nil {
		t.Fatal(err)
	}
}

// TestProcessesHammer: several processes take one name over and over; no
// two are ever inside at once, and tokens enter in increasing order.
func TestProcessesHammer(t *testing.T) {
	dir := t.TempDir()
	const procs = 3
	var cs []*child
	for i := 0; i < procs; i++ {
		cs = append(cs, startChild(t, "hammer", append(dirEnv(dir, "hot"), "FILELOCK_FOR=2s")...))
	}
	total := 0
	for _, c := range cs {
		l := c.expect(t, "COUNT")
		n, _ := strconv.Atoi(strings.Fields(l)[1])
		total += n
		c.stdin.Close()
		if err := c.cmd.Wait(); err != nil {
			t.Fatalf("child: %v", err)
		}
	}
	b, err := os.ReadFile(filepath.Join(dir, "entries"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) != total || total < procs {
		t.Fatalf("%d entries logged, children counted %d", len(lines), total)
	}
	var last uint64
	pids := map[string]int{}
	for _, l := range lines {
		f := strings.Fields(l)
		tok, _ := strconv.ParseUint(f[0], 10, 64)
		if tok <= last {
			t.Fatalf("token %d entered after %d", tok, last)
		}
		last = tok
		pids[f[1]]++
	}
	t.Logf("%d critical sections by %d processes: %v", total, len(pids), pids)
}

// TestTakeoverRace: two processes judge the same stale marker at the same
// moment, again and again; each time exactly one takes it over.
func TestTakeoverRace(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("no /proc: same-host probe unavailable")
	}
	dir := t.TempDir()
	const rounds = 60
	tmpl := template(t, dir, "tmpl")
	dead := strconv.Itoa(deadPID(t))
	for r := 0; r < rounds; r++ {
		edits := map[string]string{"nonce": fmt.Sprint("stale-", r), "pid": dead, "expires": ts(time.Now().Add(time.Hour))}
		if r%2 == 1 { // the other kind of stale: a lease that ran out on another host
			edits = map[string]string{"nonce": fmt.Sprint("stale-", r), "host": "elsewhere", "expires": ts(time.Now().Add(-time.Second))}
		}
		plant(t, filepath.Join(dir, fmt.Sprintf("race-%d.lock", r)), tmpl, edits)
	}
	env := append(dirEnv(dir, "race"), fmt.Sprint("FILELOCK_T0=", time.Now().Add(2*time.Second).UnixNano()), fmt.Sprint("FILELOCK_ROUNDS=", rounds))
	cs := []*child{startChild(t, "race", env...), startChild(t, "race", env...)}
	won := make([]int, rounds)
	perChild := make([]int, len(cs))
	for i, c := range cs {
		for r := 0; r < rounds; r++ {
			l := c.expect(t, "")
			f := strings.Fields(l)
			if len(f) < 2 || f[1] != strconv.Itoa(r) || f[0] != "WON" && f[0] != "LOCKED" {
				t.Fatalf("round %d: child said %q", r, l)
			}
			if f[0] == "WON" {
				won[r]++
				perChild[i]++
			}
		}
		c.expect(t, "DONE")
	}
	for r, n := range won {
		if n != 1 {
			t.Errorf("round %d: %d winners", r, n)
		}
	}
	t.Logf("%d rounds, won per process: %v", rounds, perChild)
	for _, c := range cs {
		c.stdin.Close()
		if err := c.cmd.Wait(); err != nil {
			t.Fatalf("child: %v", err)
		}
	}
}

// TestWaitAcrossProcesses: a waiter is woken when a holder in another
// process releases (by inotify on Linux, else by polling).
func TestWaitAcrossProcesses(t *testing.T) {
	dir := t.TempDir()
	f := newFactory(t, filelock.WithDir(dir), filelock.WithLogger(nil))
	c := startChild(t, "hold", dirEnv(dir, "handoff")...)
	tok := tokenOf(t, c.expect(t, "ACQUIRED"))
	type result struct {
		h   *filelock.Holder
		err error
		at  time.Time
	}
	got := make(chan result, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		h, err := f.Acquire(ctx, "handoff", filelock.WithWait())
		got <- result{h, err, time.Now()}
	}()
	awaitWaiter(t, dir, "handoff")
	released := time.Now()
	c.stdin.Close()
	r := <-got
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.h.Token() <= tok {
		t.Fatalf("token %d after %d", r.h.Token(), tok)
	}
	t.Logf("hand-off across processes: %v after the release was asked for", r.at.Sub(released))
	r.h.Release()
	if err := c.cmd.Wait(); err != nil {
		t.Fatalf("child: %v", err)
	}
}

// TestProbeSurvivesClockStep: a process started after the wall clock was
// stepped computes every earlier process's start time off by the step (boot
// time is wall clock minus uptime). A live holder must not be judged dead
// for it, whichever way and however far the clock went. The step is
// simulated by shifting the start time in a live child's marker by what a
// judge started after the step would see.
func TestProbeSurvivesClockStep(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("no /proc: same-host probe unavailable")
	}
	dir := t.TempDir()
	f := newFactory(t, filelock.WithDir(dir), filelock.WithLogger(nil))
	c := startChild(t, "hold", append(dirEnv(dir, "stepped"), "FILELOCK_TTL=1h")...)
	c.expect(t, "ACQUIRED")
	path := filepath.Join(dir, "stepped.lock")
	orig := fields(t, path)
	start, err := time.Parse(time.RFC3339Nano, orig["start"])
	if err != nil {
		t.Fatal(err)
	}
	for _, step := range []time.Duration{3 * time.Second, -3 * time.Second, 30 * time.Second, -30 * time.Second, 24 * time.Hour} {
		plant(t, path, orig, map[string]string{"start": ts(start.Add(step))})
		h, err := f.Acquire(context.Background(), "stepped")
		if err == nil {
			h.Release()
			t.Fatalf("clock stepped %v: the live holder's marker was taken over", step)
		}
		if !errors.Is(err, filelock.ErrLocked) {
			t.Fatalf("clock stepped %v: Acquire = %v; want ErrLocked", step, err)
		}
	}
	c.stdin.Close() // the child releases: its marker must still be its own
	if err := c.cmd.Wait(); err != nil {
		t.Fatalf("child: %v", err)
	}
	select {
	case l, ok := <-c.lines:
		if ok {
			t.Fatalf("child said %q after releasing", l)
		}
	default:
	}
}

// TestStalledRefreshLosesOnTime: a holder whose refresh is stuck in fsync
// is still told it lost the lock at its deadline, while the fsync is stuck
// and before anyone can take its marker over.
func TestStalledRefreshLosesOnTime(t *testing.T) {
	dir := t.TempDir()
	f := newFactory(t, filelock.WithDir(dir), filelock.WithLogger(nil))
	h, err := f.AsLocker(filelock.WithStaleAfter(time.Second)).Acquire(context.Background(), "disk")
	if err != nil {
		t.Fatal(err)
	}
	ours := fmt.Sprintf("\ntoken=%d\n", h.Token())
	stalled, unstall := make(chan struct{}), make(chan struct{})
	var once sync.Once
	filelock.SetSyncHook(func(path string) error {
		if b, _ := os.ReadFile(path); strings.Contains(string(b), ours) {
			once.Do(func() { close(stalled) })
			<-unstall // every refresh of h stalls until the test lets go
		}
		return nil
	})
	defer filelock.SetSyncHook(nil)
	var unstallOnce sync.Once
	letGo := func() { unstallOnce.Do(func() { close(unstall) }) }
	defer letGo() // before the factory closes: Close waits for the refresh

	select {
	case <-stalled:
	case <-time.After(30 * time.Second):
		t.Fatal("the holder never refreshed")
	}
	// Another factory waits for the name; it can have it once the stalled
	// marker's lease has run out. By then the holder must know.
	told := toldAt(h)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	h2, err := newFactory(t, filelock.WithDir(dir), filelock.WithLogger(nil)).Acquire(ctx, "disk", filelock.WithWait())
	if err != nil {
		t.Fatalf("the stalled holder's marker was never freed: %v", err)
	}
	defer h2.Release()
	taken := time.Now()
	select {
	case <-h.Done():
	default:
		t.Fatal("the marker was taken over before its holder, stalled in fsync, was told")
	}
	t.Logf("holder told %v before the successor had the lock", taken.Sub(<-told))
	if !errors.Is(h.Err(), filelock.ErrLockLost) {
		t.Fatalf("Err = %v; want ErrLockLost", h.Err())
	}
	letGo()
	// The stalled refresh, let go, must not disturb the successor.
	if err := h2.Extend(ctx); err != nil {
		t.Fatalf("successor after the stalled refresh went on: %v", err)
	}
}

// toldAt delivers the time h's Done closed, for the log.
func toldAt(h lock.Holder) <-chan time.Time {
	ch := make(chan time.Time, 1)
	go func() { <-h.Done(); ch <- time.Now() }()
	return ch
}

// TestStuckNameDoesNotDelayOthers: while another process is stopped inside
// the guard of name a, a holder of name b in the same factory whose
// refreshes fail is told it lost b before anyone can take b over.
func TestStuckNameDoesNotDelayOthers(t *testing.T) {
	dir := t.TempDir()
	f := newFactory(t, filelock.WithDir(dir), filelock.WithLogger(nil))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ha, err := f.AsLocker(filelock.WithStaleAfter(time.Second)).Acquire(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	c := startChild(t, "guard", dirEnv(dir, "a")...)
	c.expect(t, "GUARDED")
	testenv.Pause(t, c.cmd.Process)

	aRefreshing := make(chan struct{})
	var once sync.Once
	var bToken atomic.Uint64
	filelock.SetSyncHook(func(path string) error {
		b, _ := os.ReadFile(path)
		switch {
		case strings.Contains(string(b), fmt.Sprintf("\ntoken=%d\n", ha.Token())):
			once.Do(func() { close(aRefreshing) }) // next: wait for the stopped guard
		case bToken.Load() != 0 && strings.Contains(string(b), fmt.Sprintf("\ntoken=%d\n", bToken.Load())):
			return unix.EIO // b's refreshes fail
		}
		return nil
	})
	defer filelock.SetSyncHook(nil)
	select {
	case <-aRefreshing:
	case <-ctx.Done():
		t.Fatal("a was never refreshed")
	}
	hb, err := f.AsLocker(filelock.WithStaleAfter(200*time.Millisecond)).Acquire(ctx, "b")
	if err != nil {
		t.Fatal(err)
	}
	bToken.Store(hb.Token())
	told := toldAt(hb)
	h2, err := newFactory(t, filelock.WithDir(dir), filelock.WithLogger(nil)).Acquire(ctx, "b", filelock.WithWait())
	if err != nil {
		t.Fatalf("b was never freed: %v", err)
	}
	defer h2.Release()
	taken := time.Now()
	select {
	case <-hb.Done():
	default:
		t.Fatal("b was taken over before its holder was told, while a's guard was stuck")
	}
	t.Logf("b's holder told %v before the successor had the lock", taken.Sub(<-told))
	if !errors.Is(hb.Err(), filelock.ErrLockLost) {
		t.Fatalf("Err = %v; want ErrLockLost", hb.Err())
	}
}

// TestHugeMarker: a marker file too large to be one of ours (over 1 MiB) is
// judged like any unreadable marker (by its age), not an error that blocks
// the name.
func TestHugeMarker(t *testing.T) {
	dir := t.TempDir()
	f := newFactory(t, filelock.WithDir(dir), filelock.WithLogger(nil), filelock.WithStaleAfter(time.Minute))
	path := filepath.Join(dir, "big.lock")
	if err := os.WriteFile(path, make([]byte, 2<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	mustLocked(t, f, "big")
	if n, err := f.Sweep(context.Background(), 0); n != 0 || err != nil {
		t.Fatalf("Sweep of a young huge marker = %d, %v; want 0, nil", n, err)
	}
	old := time.Now().Add(-2 * time.Minute)
	os.Chtimes(path, old, old)
	if n, err := f.Sweep(context.Background(), 0); n != 1 || err != nil {
		t.Fatalf("Sweep of an old huge marker = %d, %v; want 1, nil", n, err)
	}
	mustAcquire(t, f, "big").Release()
	// Nor does it write one: its own read-backs would not know it.
	_, err := f.Acquire(context.Background(), "big", filelock.WithMetadata("blob", strings.Repeat("x", 2<<20)))
	if !errors.Is(err, lock.ErrInvalidOption) {
		t.Fatalf("Acquire with 2 MiB of metadata = %v; want ErrInvalidOption", err)
	}
	mustAcquire(t, f, "big").Release()
}

// TestDeletedCounterKeepsLimitCheck: with <name>.token deleted, a mutex is
// not granted beside a semaphore permit held in any slot, nor a permit of
// another limit beside it.
func TestDeletedCounterKeepsLimitCheck(t *testing.T) {
	dir := t.TempDir()
	f := newFactory(t, filelock.WithDir(dir), filelock.WithLogger(nil))
	sem := filelock.WithMaxConcurrent(3)
	p0, p1 := mustAcquire(t, f, "pool", sem), mustAcquire(t, f, "pool", sem)
	defer p1.Release()
	if !strings.HasSuffix(p1.Path(), "pool.1.lock") {
		t.Fatalf("second permit at %s; want slot 1", p1.Path())
	}
	p0.Release() // only slot 1 is held now
	for _, opts := range [][]filelock.Option{nil, {filelock.WithMaxConcurrent(2)}} {
		os.Remove(filepath.Join(dir, "pool.token"))
		h, err := f.Acquire(context.Background(), "pool", opts...)
		if err == nil {
			h.Release()
			t.Fatalf("with the counter deleted, %d options: granted beside the permit in slot 1", len(opts))
		}
		if !errors.Is(err, lock.ErrLimitMismatch) {
			t.Fatalf("with the counter deleted: Acquire = %v; want ErrLimitMismatch", err)
		}
	}
}

// TestPIDNamespaceSharingProc: in a PID namespace that still sees the
// host's /proc (unshare --pid --fork without --mount-proc), /proc/<pid>
// names another process than pid does. A judge there must not declare a
// live holder of the same namespace dead from what /proc says.
func TestPIDNamespaceSharingProc(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for unshare --pid")
	}
	if err := exec.Command("unshare", "--pid", "--fork", "true").Run(); err != nil {
		t.Skipf("unshare --pid: %v", err)
	}
	// Place the holder at a PID that no host process has, so that what
	// /proc says of it is plainly not about the holder.
	k := 0
	for i := 3; i < 300 && k == 0; i++ {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", i)); errors.Is(err, os.ErrNotExist) {
			k = i
		}
	}
	if k == 0 {
		t.Skip("no free low host PID")
	}
	dir := t.TempDir()
	env := append(dirEnv(dir, "ns"), "FILELOCK_TTL=1h")
	// sh is PID 1 and forks k-2 processes, so the holder is PID k.
	script := fmt.Sprintf(`i=2; while [ $i -lt %d ]; do /bin/true; i=$((i+1)); done; "$0" "$@"; :`, k)
	holder := startChildVia(t, []string{"unshare", "--pid", "--fork", "--kill-child", "sh", "-c", script}, "hold", env...)
	holder.expect(t, "ACQUIRED")
	if pid := fields(t, filepath.Join(dir, "ns.lock"))["pid"]; pid != strconv.Itoa(k) {
		t.Fatalf("holder has PID %s in its namespace; the test meant %d", pid, k)
	}
	ns := fmt.Sprintf("--pid=/proc/%d/ns/pid_for_children", holder.cmd.Process.Pid)
	judge := startChildVia(t, []string{"nsenter", ns, "--"}, "try", env...)
	if l := judge.expect(t, ""); l != "LOCKED" {
		t.Fatalf("a judge in the holder's namespace said %q; want LOCKED", l)
	}
	mustLocked(t, newFactory(t, filelock.WithDir(dir), filelock.WithLogger(nil)), "ns")
	holder.stdin.Close()
	if err := holder.cmd.Wait(); err != nil {
		t.Fatalf("holder: %v", err)
	}
}

// TestProbeAcrossTimeNamespace: start ticks count from the boot time of the
// reader's time namespace, so a holder in a time namespace with a boot-time
// offset (unshare --time --boottime) must not look like a reused PID to a
// judge outside it.
func TestProbeAcrossTimeNamespace(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for unshare --time")
	}
	if err := exec.Command("unshare", "--time", "--boottime", "1000", "true").Run(); err != nil {
		t.Skipf("unshare --time: %v", err)
	}
	dir := t.TempDir()
	f := newFactory(t, filelock.WithDir(dir), filelock.WithLogger(nil))
	c := startChildVia(t, []string{"unshare", "--time", "--boottime", "1000"}, "hold", append(dirEnv(dir, "timens"), "FILELOCK_TTL=1h")...)
	c.expect(t, "ACQUIRED")
	mustLocked(t, f, "timens")
	c.stdin.Close()
	if err := c.cmd.Wait(); err != nil {
		t.Fatalf("child: %v", err)
	}
}

// TestDeletedCounterKeepsReaders: with the counter file gone (it also says
// how many reader slots may be in use), a writer still finds a reader in
// a slot above the lowest, a semaphore caller still hears of the limit
// mismatch, and a new reader takes a free slot beside it.
func TestDeletedCounterKeepsReaders(t *testing.T) {
	dir := t.TempDir()
	f := newFactory(t, filelock.WithDir(dir), filelock.WithLogger(nil))
	shared := filelock.WithShared()
	r0, r1 := mustAcquire(t, f, "schema", shared), mustAcquire(t, f, "schema", shared)
	defer r1.Release()
	if !strings.HasSuffix(r1.Path(), "schema.1.lock") {
		t.Fatalf("second reader at %s; want slot 1", r1.Path())
	}
	r0.Release() // only slot 1 is held now
	counter := filepath.Join(dir, "schema.token")
	os.Remove(counter)
	mustLocked(t, f, "schema")
	os.Remove(counter)
	if h, err := f.Acquire(context.Background(), "schema", filelock.WithMaxConcurrent(2)); !errors.Is(err, lock.ErrLimitMismatch) {
		if err == nil {
			h.Release()
		}
		t.Fatalf("semaphore beside a reader, counter deleted: Acquire = %v; want ErrLimitMismatch", err)
	}
	os.Remove(counter)
	r := mustAcquire(t, f, "schema", shared)
	if r.Token() <= r1.Token() {
		t.Errorf("reader's token %d after %d", r.Token(), r1.Token())
	}
	r.Release()
	mustLocked(t, f, "schema") // the counter written since says slot 1 may be in use
}
