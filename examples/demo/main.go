// Command demo shows in a few seconds, with no infrastructure, four things
// this library does, each with real processes (this program re-run as
// children) and each checked: it exits non-zero if a claim does not hold.
//
//  1. flock: a holder killed with SIGKILL frees its lock at once. The
//     kernel drops a dead process's file locks, so there is no TTL to wait
//     out and nothing to clean up.
//  2. filelock + filelock.Fence: a holder frozen with SIGSTOP (a GC pause, a
//     VM freeze) stops renewing its lease; once the lease runs out another
//     process takes the lock over with a larger fencing token and writes.
//     When the frozen one resumes, its late write carries the old token and
//     the fence refuses it. (flock cannot show this: a stopped process keeps
//     its kernel lock, so nobody else would ever get it.)
//  3. flock + WithWait: processes waiting for a lock get it one at a time,
//     each the moment the previous holder releases, woken (on Linux) by
//     inotify rather than a poll. flock does not queue them: the woken
//     waiters race, so the order need not be the order they arrived in; the
//     demo prints both.
//  4. flock + WithMaxConcurrent(3): a semaphore across processes; six
//     processes want it, never more than three are inside at once.
//
// Who was inside when is not taken from the lock itself: each process
// appends "enter" after Acquire and "exit" before Release to a log opened
// with O_APPEND, whose order is the order the kernel did the writes.
//
//	make demo   # or: cd examples && go run ./demo
package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/filelock"
	"github.com/ubgo/lock/flock"
	"github.com/ubgo/lock/internal/testenv"
)

// lease is the filelock lease of step 2: the frozen holder loses the lock
// this long after its last renewal.
const lease = 500 * time.Millisecond

func main() {
	switch testenv.Child() {
	case roleWorker:
		worker()
	case roleFrozen:
		frozenWriter()
	}
	dir, err := os.MkdirTemp("", "ubgo-lock-demo-")
	if err != nil {
		log.Fatal(err)
	}
	spawners := map[string]func() *exec.Cmd{}
	for _, role := range []string{roleWorker, roleFrozen} {
		if spawners[role], err = testenv.Spawner(role); err != nil {
			log.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	err = run(ctx, dir, func(role string) *exec.Cmd { return spawners[role]() })
	cancel()
	os.RemoveAll(dir)
	if err != nil {
		log.Fatal(err)
	}
}

// run shows the four claims with the lock files in dir, starting children
// with spawn, and returns an error for the first one that does not hold.
func run(ctx context.Context, dir string, spawn func(role string) *exec.Cmd) error {
	start, started := time.Now(), 0
	for _, step := range []func(context.Context, string, *group) error{killed, frozen, handOff, semaphore} {
		g := newGroup(spawn)
		err := step(ctx, dir, g)
		g.close()
		started += len(g.procs)
		if err != nil {
			return err
		}
	}
	fmt.Printf("all four claims held (%v, %d child processes)\n", time.Since(start).Round(time.Millisecond), started)
	return nil
}

// killed is claim 1: SIGKILL the holder, and the lock is free at once.
func killed(ctx context.Context, dir string, g *group) error {
	fmt.Println("[1] flock: a holder killed with SIGKILL frees its lock at once (no TTL, no cleanup)")
	holder, err := g.start(roleWorker, workerEnv(dir, "nightly", 1)...)
	if err != nil {
		return err
	}
	for _, want := range []string{"waiting", "in"} {
		if _, err := g.expect(ctx, holder, want); err != nil {
			return err
		}
	}
	killedAt := time.Now()
	holder.kill() // returns once the process is gone
	locks := flock.NewFactory(flock.WithDir(flockDir(dir)))
	defer locks.Close()
	h, err := locks.Acquire(ctx, "nightly") // no WithWait: it must be free now
	if err != nil {
		return fmt.Errorf("[1] Acquire right after the holder was killed: %w", err)
	}
	took := time.Since(killedAt)
	defer h.Release()
	fmt.Printf("    pid %d holds \"nightly\"; kill -9 %d\n", holder.pid, holder.pid)
	fmt.Printf("    → pid %d acquired \"nightly\" %s after the kill, without waiting\n", os.Getpid(), ms(took))
	return nil
}

// frozen is claim 2: a frozen holder's late write is refused by the fence.
func frozen(ctx context.Context, dir string, g *group) error {
	fmt.Printf("[2] filelock (lease %v) + filelock.Fence: a paused holder's late write is refused by its fencing token\n", lease)
	paused, err := g.start(roleFrozen, envDir+"="+dir)
	if err != nil {
		return err
	}
	line, err := g.expect(ctx, paused, "holding ")
	if err != nil {
		return err
	}
	oldToken, err := strconv.ParseUint(strings.TrimPrefix(line, "holding "), 10, 64)
	if err != nil {
		return err
	}
	if err := paused.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		return err
	}
	stoppedAt := time.Now()
	fmt.Printf("    pid %d holds \"report\" with token %d and renews its lease\n", paused.pid, oldToken)
	fmt.Printf("    kill -STOP %d just before it writes (a GC pause, a VM freeze)\n", paused.pid)

	// This process waits for the lock: the frozen holder is alive (so not
	// reclaimed at once as a dead one would be) but its lease runs out.
	locks := filelock.NewFactory(filelock.WithDir(filelockDir(dir)), filelock.WithLogger(nil))
	defer locks.Close()
	h, err := locks.Acquire(ctx, "report", filelock.WithStaleAfter(lease), filelock.WithWait())
	if err != nil {
		return fmt.Errorf("[2] taking over from the frozen holder: %w", err)
	}
	defer h.Release()
	if h.Token() <= oldToken {
		return fmt.Errorf("[2] the new holder's token %d is not above the frozen one's %d", h.Token(), oldToken)
	}
	ours := fmt.Sprintf("written by pid %d with token %d\n", os.Getpid(), h.Token())
	if err := writeReport(ctx, dir, h.Token(), ours); err != nil {
		return fmt.Errorf("[2] the new holder's write: %w", err)
	}
	fmt.Printf("    → its lease ran out: pid %d took \"report\" over %s after the freeze, with token %d, and wrote report.csv\n",
		os.Getpid(), ms(time.Since(stoppedAt)), h.Token())
	fmt.Printf("    kill -CONT %d: it writes report.csv with token %d at once\n", paused.pid, oldToken)

	if err := paused.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		return err
	}
	line, err = g.expect(ctx, paused, "")
	if err != nil {
		return err
	}
	if !strings.HasPrefix(line, "refused: ") {
		return fmt.Errorf("[2] the resumed holder's write with token %d was not refused: %s", oldToken, line)
	}
	data, err := os.ReadFile(filepath.Join(dir, "report.csv"))
	if err != nil || string(data) != ours {
		return fmt.Errorf("[2] report.csv holds %q (%v), want %q", data, err, ours)
	}
	fmt.Printf("    → %s\n", line)
	fmt.Printf("    → report.csv keeps the write of token %d\n", h.Token())
	return nil
}

// handOff is claim 3: waiting processes get the lock one at a time, each
// the moment it is released.
func handOff(ctx context.Context, dir string, g *group) error {
	const waiters = 4
	fmt.Printf("[3] flock + WithWait: %d processes wait for \"queue\"; each release hands it to one of them at once\n", waiters)
	logPath := filepath.Join(dir, "queue.log")
	locks := flock.NewFactory(flock.WithDir(flockDir(dir)))
	defer locks.Close()
	h, err := locks.Acquire(ctx, "queue")
	if err != nil {
		return err
	}
	if err := record(logPath, "enter"); err != nil {
		return err
	}
	var arrived []int
	var ws []*proc
	for range waiters {
		// One at a time, so that they arrive in a known order.
		w, err := g.start(roleWorker, workerEnv(dir, "queue", 1)...)
		if err != nil {
			return err
		}
		if _, err := g.expect(ctx, w, "waiting"); err != nil {
			return err
		}
		ws, arrived = append(ws, w), append(arrived, w.pid)
	}
	if err := record(logPath, "exit"); err != nil {
		return err
	}
	if err := h.Release(); err != nil {
		return err
	}
	if err := serve(ctx, g, ws, 1); err != nil {
		return err
	}
	r, err := readLog(logPath)
	if err != nil {
		return err
	}
	served := slices.DeleteFunc(r.order, func(pid int) bool { return pid == os.Getpid() })
	if r.peak != 1 || !sameSet(served, arrived) {
		return fmt.Errorf("[3] %d inside at once (want 1); served %v, want each of %v once", r.peak, served, arrived)
	}
	var gaps []string
	for _, d := range r.handoffs {
		gaps = append(gaps, ms(d))
	}
	fmt.Printf("    arrived in the order %v\n", arrived)
	fmt.Printf("    → served one at a time, in the order %v; from each release to the next Acquire's return: %s\n",
		served, strings.Join(gaps, ", "))
	fmt.Println("    (flock promises no order: a release wakes the waiters, on Linux through inotify, and the first to retry wins)")
	return nil
}

// semaphore is claim 4: a semaphore of 3 across processes.
func semaphore(ctx context.Context, dir string, g *group) error {
	const limit, workers = 3, 6
	fmt.Printf("[4] flock + WithMaxConcurrent(%d): %d processes want \"render\"; never more than %d inside at once\n", limit, workers, limit)
	logPath := filepath.Join(dir, "render.log")
	var ws []*proc
	for range workers {
		w, err := g.start(roleWorker, workerEnv(dir, "render", limit)...)
		if err != nil {
			return err
		}
		ws = append(ws, w)
	}
	if err := serve(ctx, g, ws, limit); err != nil {
		return err
	}
	r, err := readLog(logPath)
	if err != nil {
		return err
	}
	if r.peak != limit || len(r.order) != workers {
		return fmt.Errorf("[4] peak %d inside at once (want %d), %d of %d processes got in", r.peak, limit, len(r.order), workers)
	}
	fmt.Printf("    → all %d got in, in order %v; peak inside at once: %d\n", workers, r.order, r.peak)
	return nil
}

// The children's roles, and the environment that tells them what to do.
const (
	roleWorker = "demo-worker"
	roleFrozen = "demo-frozen"
	envDir     = "DEMO_DIR"
	envName    = "DEMO_NAME"
	envLimit   = "DEMO_LIMIT"
)

func workerEnv(dir, name string, limit int) []string {
	return []string{envDir + "=" + dir, envName + "=" + name, envLimit + "=" + strconv.Itoa(limit)}
}

func flockDir(dir string) string    { return filepath.Join(dir, "flock") }
func filelockDir(dir string) string { return filepath.Join(dir, "filelock") }

// worker waits for the flock lock (a semaphore of DEMO_LIMIT) on
// DEMO_NAME, prints "in <token>" and logs "enter", then holds it until its
// stdin closes, logs "exit" and releases.
func worker() {
	err := func() error {
		dir, name := os.Getenv(envDir), os.Getenv(envName)
		limit, err := strconv.Atoi(os.Getenv(envLimit))
		if err != nil {
			return err
		}
		locks := flock.NewFactory(flock.WithDir(flockDir(dir)))
		fmt.Println("waiting")
		h, err := locks.Acquire(context.Background(), name, flock.WithMaxConcurrent(limit), flock.WithWait())
		if err != nil {
			return err
		}
		logPath := filepath.Join(dir, name+".log")
		if err := record(logPath, "enter"); err != nil {
			return err
		}
		fmt.Printf("in %d\n", h.Token())
		bufio.NewReader(os.Stdin).ReadString('\n') // until the parent lets it go
		// Logged before the release, so the log never shows two inside.
		err = record(logPath, "exit")
		return errors.Join(err, h.Release())
	}()
	if err != nil {
		fmt.Printf("error: %v\n", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// frozenWriter takes filelock's "report" with a short lease, renewed in the
// background (AsLocker), prints "holding <token>", and writes report.csv
// with its token as soon as it is resumed by SIGCONT: waiting for the
// signal stands for the moment between taking the lock and writing at
// which the pause hits. It prints "refused: <why>" if the fence refuses.
func frozenWriter() {
	ctx := context.Background()
	dir := os.Getenv(envDir)
	locks := filelock.NewFactory(filelock.WithDir(filelockDir(dir)), filelock.WithLogger(nil))
	h, err := locks.AsLocker(filelock.WithStaleAfter(lease)).Acquire(ctx, "report")
	if err != nil {
		fmt.Printf("error: %v\n", err)
		os.Exit(1)
	}
	resumed := make(chan os.Signal, 1)
	signal.Notify(resumed, syscall.SIGCONT)
	fmt.Printf("holding %d\n", h.Token())
	<-resumed
	err = writeReport(ctx, dir, h.Token(), fmt.Sprintf("written by pid %d with token %d\n", os.Getpid(), h.Token()))
	switch {
	case errors.Is(err, lock.ErrStaleToken):
		fmt.Printf("refused: %v\n", err)
	case err != nil:
		fmt.Printf("error: %v\n", err)
	default:
		fmt.Println("written")
	}
	os.Exit(0)
}

// writeReport writes report.csv if token is not below the highest token
// the fence has seen for it: filelock.Fence.Apply holds the fence record's
// file lock while it compares and writes, so no other fenced writer on the
// host comes in between.
func writeReport(ctx context.Context, dir string, token uint64, data string) error {
	fence := filelock.NewFence(filelock.WithDir(filelockDir(dir)))
	return fence.Apply(ctx, "report.csv", token, func() error {
		return os.WriteFile(filepath.Join(dir, "report.csv"), []byte(data), 0o644)
	})
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond)) }

func sameSet(a, b []int) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}
