//go:build unix

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/ubgo/lock"
)

// waitFlag is -w: a duration ("5s", "1m") or, as flock(1) takes it, a
// number of seconds ("5", "0.5").
type waitFlag struct{ d time.Duration }

func (w *waitFlag) String() string { return w.d.String() }

func (w *waitFlag) Set(s string) error {
	d, err := time.ParseDuration(s)
	if err != nil {
		secs, ferr := strconv.ParseFloat(s, 64)
		if ferr != nil {
			return fmt.Errorf("want a duration (5s) or seconds (5): %q", s)
		}
		d = time.Duration(secs * float64(time.Second))
	}
	if d <= 0 {
		return fmt.Errorf("must be positive: %q", s)
	}
	w.d = d
	return nil
}

// runFlags are the flags of lock run.
type runFlags struct {
	common
	noWait    bool
	wait      waitFlag
	conflict  int
	quiet     bool // no message when the lock is held (-q, or -E given)
	ttl       time.Duration
	max       int
	owner     string
	killAfter time.Duration
}

func runCmd(args []string, stderr io.Writer) int {
	f, name, argv, err := parseRun(args, stderr)
	if err != nil {
		return fail(stderr, err)
	}

	// A signal before the command starts ends the Acquire (and lock, with
	// 128+n); once it runs, signals go to its group.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	acquiring := make(chan struct{})
	go func() {
		select {
		case s := <-sigs:
			cancel(signalError{s.(syscall.Signal)})
		case <-acquiring:
		}
	}()

	b, err := open(ctx, f.backend, f.prefix)
	if err != nil {
		close(acquiring)
		return failSignal(ctx, stderr, err)
	}
	h, code := acquire(ctx, b, &f, name, stderr)
	close(acquiring)
	if h == nil {
		// Often an outage: a close against a silent store would wait out
		// its timeouts, after the Acquire kept its deadline.
		within(closeGrace, func() { b.Close() })
		return code
	}
	if ctx.Err() != nil { // a signal came as the Acquire returned
		h.Release()
		b.Close()
		return failSignal(ctx, stderr, ctx.Err())
	}
	code = supervise(h, b, name, f.backend, f.killAfter, argv, sigs, stderr)
	if err := finish(h, b); err != nil {
		fmt.Fprintf(stderr, "lock: release %s: %v\n", name, err)
	}
	return code
}

// parseRun parses the arguments of lock run: its flags, the name and the
// command.
func parseRun(args []string, stderr io.Writer) (f runFlags, name string, argv []string, err error) {
	fs := flags("run", &f.common, stderr)
	fs.BoolVar(&f.noWait, "n", false, "fail at once if the lock is held (the default)")
	fs.Var(&f.wait, "w", "wait up to this long for the lock")
	fs.IntVar(&f.conflict, "E", exitConflict, "exit code when the lock is held (and no message)")
	fs.BoolVar(&f.quiet, "q", false, "no message when the lock is held")
	fs.DurationVar(&f.ttl, "ttl", 0, "lease length")
	fs.IntVar(&f.max, "max-concurrent", 1, "permits of a semaphore")
	fs.StringVar(&f.owner, "owner", "", "owner shown by inspect (default pid@host)")
	fs.DurationVar(&f.killAfter, "kill-after", 0, "SIGKILL this long after SIGTERM on loss")
	pos, err := parse(fs, &f.common, args, 1, -1)
	if err != nil {
		return f, "", nil, err
	}
	if len(pos) < 3 {
		return f, "", nil, usagef("lock run: want NAME -- CMD [ARGS...]")
	}
	name, argv = pos[0], pos[1:]
	fs.Visit(func(fl *flag.Flag) {
		// As flock(1): a caller that chose the code needs no message,
		// and cron mails any output.
		f.quiet = f.quiet || fl.Name == "E"
	})
	switch {
	case argv[0] != "--":
		err = usagef("lock run: want NAME -- CMD [ARGS...]; got %q after the name", argv[0])
	case f.noWait && f.wait.d > 0:
		err = usagef("lock run: -n and -w exclude each other")
	case f.conflict < 0 || f.conflict > 255:
		err = usagef("lock run: -E %d: want 0 to 255", f.conflict)
	case f.max < 1:
		err = usagef("lock run: --max-concurrent %d: want at least 1", f.max)
	case f.ttl < 0 || f.killAfter < 0:
		err = usagef("lock run: --ttl and --kill-after must be positive")
	}
	return f, name, argv[1:], err
}

// acquire takes name on b as f says, filling in f's defaults that depend
// on the backend (--kill-after, --owner). It returns the holder, or nil
// and lock run's exit code.
func acquire(ctx context.Context, b *backend, f *runFlags, name string, stderr io.Writer) (lock.Holder, int) {
	ttl := b.ttl
	if f.ttl > 0 {
		if b.ttl == 0 {
			return nil, fail(stderr, usagef("lock run: --ttl: %s locks have no lease (they end with the %s)", b.kind, map[string]string{"flock": "lock file's descriptor", "pglock": "database session"}[b.kind]))
		}
		ttl = f.ttl
	}
	if f.killAfter == 0 {
		// At most half the margin by which a lease backend declares a
		// lock lost before its lease can run out on the server (each
		// backend's guide, Loss), so the group is dead before another
		// holder can be granted the lock.
		f.killAfter = min(ttl/20, time.Second)
		if ttl == 0 {
			f.killAfter = time.Second
		}
	}
	if f.owner == "" {
		host, _ := os.Hostname()
		f.owner = fmt.Sprintf("%d@%s", os.Getpid(), host)
	}
	opts := []lock.Option{lock.WithOwner(f.owner), lock.WithMaxConcurrent(f.max)}
	if f.ttl > 0 {
		opts = append(opts, lock.WithTTL(f.ttl))
	}
	if f.wait.d > 0 {
		opts = append(opts, lock.WithWaitTimeout(f.wait.d))
	}
	h, err := b.AsLocker(opts...).Acquire(ctx, name)
	if err != nil {
		return nil, acquireFailed(ctx, err, f, name, stderr)
	}
	return h, 0
}

// acquireFailed reports a failed Acquire and returns its exit code, by the
// error's class: contention (lock.ErrLocked: the name is held, or -w ran
// out while it was) is -E's code; a bad name or option, or a limit other
// holders disagree with, is a usage error; anything else — the server
// failed, went away or did not answer, also during a -w wait — is
// exitUnavailable, or 128+n after a signal.
func acquireFailed(ctx context.Context, err error, f *runFlags, name string, stderr io.Writer) int {
	switch {
	case ctx.Err() == nil && errors.Is(err, lock.ErrLocked):
		what := "is held"
		if f.wait.d > 0 {
			what = fmt.Sprintf("is still held after waiting %v", f.wait.d)
		}
		if !f.quiet {
			fmt.Fprintf(stderr, "lock: %s %s\n", name, what)
		}
		return f.conflict
	case errors.Is(err, lock.ErrInvalidName) || errors.Is(err, lock.ErrInvalidOption) || errors.Is(err, lock.ErrLimitMismatch):
		return fail(stderr, usagef("lock run: %v", err))
	}
	return failSignal(ctx, stderr, err)
}

// closeGrace bounds the close after a failed Acquire: what a store out of
// reach did not get (a waiter's place in a queue) ends with its lease.
const closeGrace = 250 * time.Millisecond

// lostGrace bounds the release and close of a lost lock on lock run's way
// out. The store is likely out of reach (that is often why the lock was
// lost), and each call would wait out the backend's release timeout
// (backend.ReleaseTimeout, 10s) for nothing: a lost lock has nothing left to
// release, and what may remain on the server (a Redis key, an etcd lease)
// ends with its lease. Within the grace a reachable store still gets the
// clean-up (redislock removes a key it gave up by its own clock).
const lostGrace = 500 * time.Millisecond

// finish releases h and closes b: in full if h was not lost, returning
// Release's error; if it was, in the background for at most lostGrace,
// which lock's exit then cuts short.
func finish(h lock.Holder, b *backend) error {
	if h.Err() == nil {
		err := h.Release()
		b.Close()
		return err
	}
	within(lostGrace, func() {
		h.Release()
		b.Close()
	})
	return nil
}

// within runs f and waits for it at most d; lock's exit cuts short what is
// left of it.
func within(d time.Duration, f func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	select {
	case <-done:
	case <-time.After(d):
	}
}

// signalError is the cause of a run ended by a signal before its command
// started.
type signalError struct{ sig syscall.Signal }

func (e signalError) Error() string { return "interrupted by " + e.sig.String() }

// failSignal is fail, except that a run interrupted by a signal exits as
// if killed by it: 128+n.
func failSignal(ctx context.Context, stderr io.Writer, err error) int {
	var se signalError
	if errors.As(context.Cause(ctx), &se) {
		fmt.Fprintf(stderr, "lock: %v\n", se)
		return 128 + int(se.sig)
	}
	return fail(stderr, err)
}

// supervise runs argv under h and returns the exit code of lock run.
func supervise(h lock.Holder, b *backend, name, url string, killAfter time.Duration, argv []string, sigs <-chan os.Signal, stderr io.Writer) int {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(),
		"LOCK_NAME="+name,
		"LOCK_TOKEN="+strconv.FormatUint(h.Token(), 10),
		"LOCK_BACKEND="+url)
	cmd.SysProcAttr = childAttr()
	if err := h.Err(); err != nil {
		// Lost between the acquire and here (this process was paused).
		fmt.Fprintf(stderr, "lock: %s lost (%v) before the command started\n", name, err)
		return exitLost
	}
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(stderr, "lock: %v\n", err)
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist) {
			return exitNotFound
		}
		return exitCannotRun
	}
	// The child leads its group: its pid is the group's id, and stays
	// reserved while any member of the group lives.
	group := cmd.Process.Pid
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()

	var lost bool
	var kill <-chan time.Time
	done := h.Done()
	for {
		select {
		case s := <-sigs:
			syscall.Kill(-group, s.(syscall.Signal))
		case <-done:
			done, lost = nil, true
			fmt.Fprintf(stderr, "lock: %s lost (%v): stopping the command (SIGTERM, SIGKILL after %v)\n", name, h.Err(), killAfter)
			syscall.Kill(-group, syscall.SIGTERM)
			kill = time.After(killAfter)
		case <-kill:
			syscall.Kill(-group, syscall.SIGKILL)
		case <-exited:
			if lost {
				// What the command left behind in its group goes too,
				// before lock exits: a caller that sees 75 may start the
				// work again.
				killGroup(group)
				return exitLost
			}
			// The lock may have been lost as the command exited: the
			// loss wins, so that a caller never takes a run whose lock
			// ended early for a clean one.
			if h.Err() != nil {
				fmt.Fprintf(stderr, "lock: %s lost (%v) as the command exited\n", name, h.Err())
				return exitLost
			}
			return status(cmd.ProcessState)
		}
	}
}

// killGroup kills process group g and waits, a second at most, until the
// kernel has ended every member (SIGKILL is delivered asynchronously).
func killGroup(g int) {
	syscall.Kill(-g, syscall.SIGKILL)
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); {
		if syscall.Kill(-g, 0) == syscall.ESRCH {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// status is the exit code that passes a child's end through: its exit
// status, or 128+n for a death by signal n (capped at 255).
func status(ps *os.ProcessState) int {
	if ps == nil {
		return exitCannotRun
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return min(128+int(ws.Signal()), 255)
	}
	return ps.ExitCode()
}
