// Command 11-flaky-retries is use case 11: a scheduler retries jobs
// aggressively; a retry of a job whose earlier attempt is still running
// (it just has not reported back) must not launch it again, while a retry
// of an attempt that crashed must run.
//
// Each attempt runs the job under filelock's lock "job:<id>", with
// WithStaleAfter as the lease. Underneath, filelock keeps one marker file
// per held lock (<dir>/job%3A42.lock: pid, host, process start time, lease
// expiry), renewed every third of the stale window while the attempt runs
// (WithLock's default). A retry that finds the marker gets ErrLocked and
// skips, unless the marker is stale:
//
//   - its holder died on this host — the pid is gone, or is another
//     process now (start time differs) — which the retry's Acquire proves
//     at once, whatever the stale window: a crashed attempt is retried
//     immediately;
//   - or its lease ran out (no refresh for the stale window): the holder is
//     on another host, or alive here but not running (stopped, frozen).
//     That attempt, when it runs again, finds its lock lost: its context is
//     cancelled with ErrLockLost and it stops, so the two attempts never
//     both run.
//
// The demo plays the earlier attempts in real second processes of this
// program: one that hangs and is killed with SIGKILL, one that is frozen
// with SIGSTOP past the stale window and then resumed with SIGCONT.
//
//	go run ./11-flaky-retries
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/ubgo/lock/examples/internal/replica"
	"github.com/ubgo/lock/filelock"
	"github.com/ubgo/lock/internal/testenv"
)

// RunJob runs one attempt of job jobID unless another attempt is in
// flight, and reports whether it ran.
func RunJob(ctx context.Context, locks *filelock.Factory, jobID string, staleAfter time.Duration,
	runJobBody func(ctx context.Context, jobID string) error) (ran bool, err error) {
	err = locks.WithLock(ctx, "job:"+jobID, func(ctx context.Context) error {
		ran = true
		return runJobBody(ctx, jobID)
	}, filelock.WithStaleAfter(staleAfter))
	if errors.Is(err, filelock.ErrLocked) {
		return false, nil // another attempt is in flight; don't run this one
	}
	return ran, err
}

// config is one run of the demo.
type config struct {
	Dir string
	// Stale is the stale window of the frozen attempt's job; the crashed
	// one uses 30 minutes, which its retry does not have to wait for.
	Stale time.Duration
	// Spawn returns the command of a second process of this program that
	// plays an earlier attempt (see attempt).
	Spawn func() *exec.Cmd
}

// result is what the retries did.
type result struct {
	SkippedWhileRunning bool          // retry of job 42 while attempt 1 ran: skipped
	RanAfterCrash       bool          // retry of job 42 after attempt 1 was killed: ran
	CrashRetryWaited    time.Duration // how long after the kill it ran
	SkippedWhileFrozen  bool          // retry of job 43 right after attempt 1 froze: skipped
	RanAfterStale       bool          // a retry of job 43 ran once the lease ran out
	FrozenSawLoss       string        // what the frozen attempt said when resumed
}

func run(ctx context.Context, cfg config) (res result, err error) {
	locks := filelock.NewFactory(filelock.WithDir(cfg.Dir))
	defer locks.Close()
	body := func(ctx context.Context, jobID string) error {
		fmt.Printf("pid %d: running job %s\n", os.Getpid(), jobID)
		return nil
	}

	// Job 42: attempt 1 hangs, then crashes.
	a1, lines, err := startAttempt(cfg, "42", 30*time.Minute)
	if err != nil {
		return res, err
	}
	defer a1.Wait()
	defer a1.Process.Kill()
	if err := expect(lines, "running"); err != nil {
		return res, err
	}
	ran, err := RunJob(ctx, locks, "42", 30*time.Minute, body)
	if err != nil {
		return res, err
	}
	res.SkippedWhileRunning = !ran
	fmt.Printf("retry of job 42 while attempt 1 runs: ran %v\n", ran)
	fmt.Printf("kill -9 %d\n", a1.Process.Pid)
	a1.Process.Kill()
	a1.Wait()
	killed := time.Now()
	res.RanAfterCrash, err = RunJob(ctx, locks, "42", 30*time.Minute, body)
	res.CrashRetryWaited = time.Since(killed)
	if err != nil {
		return res, err
	}

	// Job 43: attempt 1 is frozen past its stale window.
	a2, lines, err := startAttempt(cfg, "43", cfg.Stale)
	if err != nil {
		return res, err
	}
	defer a2.Wait()
	defer a2.Process.Kill()
	if err := expect(lines, "running"); err != nil {
		return res, err
	}
	fmt.Printf("kill -STOP %d\n", a2.Process.Pid)
	if err := a2.Process.Signal(syscall.SIGSTOP); err != nil {
		return res, err
	}
	ran, err = RunJob(ctx, locks, "43", cfg.Stale, body)
	if err != nil {
		return res, err
	}
	res.SkippedWhileFrozen = !ran
	fmt.Printf("retry of job 43 while attempt 1 is frozen: ran %v\n", ran)
	for !res.RanAfterStale {
		select {
		case <-time.After(cfg.Stale / 4):
		case <-ctx.Done():
			return res, ctx.Err()
		}
		if res.RanAfterStale, err = RunJob(ctx, locks, "43", cfg.Stale, body); err != nil {
			return res, err
		}
	}
	fmt.Printf("kill -CONT %d\n", a2.Process.Pid)
	if err := a2.Process.Signal(syscall.SIGCONT); err != nil {
		return res, err
	}
	select {
	case line := <-lines:
		res.FrozenSawLoss = line
		fmt.Printf("attempt 1 of job 43, resumed: %s\n", line)
	case <-ctx.Done():
		return res, errors.New("the resumed attempt said nothing")
	}
	return res, nil
}

// startAttempt starts an earlier attempt in another process and returns
// the lines it prints.
func startAttempt(cfg config, jobID string, stale time.Duration) (*exec.Cmd, <-chan string, error) {
	cmd := cfg.Spawn()
	cmd.Env = append(cmd.Env, envDir+"="+cfg.Dir, envJob+"="+jobID, envStale+"="+stale.String())
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, nil, err
	}
	lines := make(chan string, 4)
	go func() {
		s := bufio.NewScanner(out)
		for s.Scan() {
			lines <- s.Text()
		}
		io.Copy(io.Discard, out)
	}()
	return cmd, lines, nil
}

func expect(lines <-chan string, prefix string) error {
	select {
	case line := <-lines:
		if !strings.HasPrefix(line, prefix) {
			return fmt.Errorf("earlier attempt said %q, want %q", line, prefix)
		}
		return nil
	case <-time.After(20 * time.Second):
		return fmt.Errorf("earlier attempt did not say %q within 20s", prefix)
	}
}

// An earlier attempt is this program again, told so by its environment.
const (
	childRole = "earlier-attempt"
	envDir    = "EXAMPLE_DIR"
	envJob    = "EXAMPLE_JOB"
	envStale  = "EXAMPLE_STALE"
)

// attempt is an earlier attempt of a job that is still running when the
// retries come: it says "running", then runs until its lock is lost, says
// "lost: <why>" and exits 3.
func attempt() {
	locks := filelock.NewFactory(filelock.WithDir(os.Getenv(envDir)), filelock.WithLogger(nil))
	stale, err := time.ParseDuration(os.Getenv(envStale))
	if err != nil {
		log.Fatal(err)
	}
	ran, err := RunJob(context.Background(), locks, os.Getenv(envJob), stale, func(ctx context.Context, jobID string) error {
		fmt.Println("running")
		<-ctx.Done()
		fmt.Printf("lost: %v\n", context.Cause(ctx))
		os.Exit(3)
		return nil
	})
	log.Fatalf("earlier attempt: ran %v: %v", ran, err)
}

func main() {
	if testenv.Child() == childRole {
		attempt()
	}
	backend := replica.Flag(replica.Filelock, replica.Filelock)
	flag.Parse()
	if err := demo(backend); err != nil {
		log.Fatal(err)
	}
}

func demo(backend func() (string, error)) error {
	if _, err := backend(); err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "example-11-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	spawn, err := testenv.Spawner(childRole)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := run(ctx, config{Dir: dir, Stale: time.Second, Spawn: spawn})
	if err != nil {
		return err
	}
	fmt.Printf("crashed attempt retried %v after the kill (stale window 30m)\n", res.CrashRetryWaited.Round(time.Millisecond))
	return nil
}
