//go:build unix

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/internal/testenv"
)

// A privateRedis is a redis-server of the test's own on a free port, which
// the test may stop (SIGSTOP) or kill: never the shared one.
type privateRedis struct {
	addr string
	cmd  *exec.Cmd
	once sync.Once
}

func startPrivateRedis(t *testing.T) *privateRedis {
	t.Helper()
	testenv.SkipShort(t, "a private redis-server")
	if _, err := exec.LookPath("redis-server"); err != nil {
		testenv.Unavailable(t, "redis-server binary", err)
	}
	addr := testenv.ClosedAddr(t)
	_, port, _ := strings.Cut(addr, ":")
	cmd := exec.Command("redis-server", "--port", port, "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", t.TempDir(), "--logfile", "")
	if err := cmd.Start(); err != nil {
		t.Fatalf("start redis-server: %v", err)
	}
	s := &privateRedis{addr: addr, cmd: cmd}
	t.Cleanup(s.kill)
	rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer rdb.Close()
	var err error
	if !testenv.Poll(10*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		err = rdb.Ping(ctx).Err()
		return err == nil
	}) {
		t.Fatalf("private redis-server on %s did not start: %v", addr, err)
	}
	return s
}

func (s *privateRedis) url() string { return "redis://" + s.addr + "/0" }

// kill ends the server at once (stopped or not), losing all it held.
func (s *privateRedis) kill() {
	s.once.Do(func() {
		s.cmd.Process.Signal(syscall.SIGKILL)
		s.cmd.Process.Signal(syscall.SIGCONT)
		s.cmd.Wait()
	})
}

// A lineWriter is the standard error of a lock command: it keeps what was
// written, and when each line was.
type lineWriter struct {
	mu      sync.Mutex
	partial string
	lines   []string
	at      []time.Time
	changed chan struct{} // closed, and replaced, at every line
}

func newLineWriter() *lineWriter { return &lineWriter{changed: make(chan struct{})} }

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.partial += string(p)
	now := time.Now()
	for {
		line, rest, ok := strings.Cut(w.partial, "\n")
		if !ok {
			break
		}
		w.lines, w.at, w.partial = append(w.lines, line), append(w.at, now), rest
		close(w.changed)
		w.changed = make(chan struct{})
	}
	return len(p), nil
}

func (w *lineWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return strings.Join(append(w.lines, w.partial), "\n")
}

// await waits for a line containing sub and returns when it was written;
// it fails t after a minute.
func (w *lineWriter) await(t *testing.T, sub string) time.Time {
	t.Helper()
	timeout := time.After(time.Minute)
	for {
		w.mu.Lock()
		for i, l := range w.lines {
			if strings.Contains(l, sub) {
				at := w.at[i]
				w.mu.Unlock()
				return at
			}
		}
		changed := w.changed
		w.mu.Unlock()
		select {
		case <-changed:
		case <-timeout:
			t.Fatalf("no line with %q on stderr within a minute; stderr:\n%s", sub, w)
		}
	}
}

// startWatched starts lock with args, its stderr a lineWriter; end waits
// for its exit (at most a minute) and returns how, and when, it ended.
func startWatched(t *testing.T, args ...string) (stderr *lineWriter, end func() (result, time.Time)) {
	t.Helper()
	stderr = newLineWriter()
	var stdout strings.Builder
	cmd := exec.Command(lockBin, args...)
	cmd.Stdout, cmd.Stderr = &stdout, stderr
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan time.Time, 1)
	go func() {
		cmd.Wait()
		exited <- time.Now()
	}()
	var once sync.Once
	var r result
	var at time.Time
	end = func() (result, time.Time) {
		once.Do(func() {
			select {
			case at = <-exited:
			case <-time.After(time.Minute):
				cmd.Process.Kill()
				at = <-exited
				t.Errorf("lock %s: still running after a minute", strings.Join(args, " "))
			}
			r = result{cmd.ProcessState.ExitCode(), stdout.String(), stderr.String()}
		})
		return r, at
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		end()
	})
	return stderr, end
}

// A -w wait that ends because the server is gone (killed while the name
// was held by another) is an outage, exit 69, not "still held": a cron
// wrapper with -E 0 would otherwise skip its job silently through the
// outage.
func TestRunWaitOutage(t *testing.T) {
	s := startPrivateRedis(t)
	url, name := s.url(), uniqueName(t)
	holdLock(t, url, name, "--ttl", "2s")
	_, end := startWatched(t, "run", "--backend", url, "-w", "2s", "-E", "0", name, "--", "sh", "-c", "echo ran")
	testenv.Eventually(t, time.Minute, "the waiter queued", func() bool { return inspectJSON(t, url, name).Waiting == 1 })
	killed := time.Now()
	s.kill()
	r, at := end()
	t.Logf("the waiter exited %d, %v after the server was killed; stderr: %s", r.code, at.Sub(killed).Round(time.Millisecond), strings.TrimSpace(r.stderr))
	r.want(t, exitUnavailable, "a -w wait through a killed server")
	if strings.Contains(r.stdout, "ran") || strings.Contains(r.stderr, "still held") {
		t.Errorf("stdout %q, stderr %q: want no run and no \"still held\"", r.stdout, r.stderr)
	}
}

// A holder whose server becomes unreachable — stopped (SIGSTOP), or behind
// a proxy that swallows all traffic — declares the lock lost; lock run kills
// the command's group (SIGKILL after --kill-after: the command ignores
// SIGTERM) and exits 75 soon after: it does not wait, on its way out, for a
// release or a close that the server cannot answer.
func TestRunLossUnreachable(t *testing.T) {
	const killAfter = 200 * time.Millisecond
	for _, fault := range []string{"sigstop", "blackhole"} {
		t.Run(fault, func(t *testing.T) {
			s := startPrivateRedis(t)
			url, cut := s.url(), func() { testenv.Pause(t, s.cmd.Process) }
			if fault == "blackhole" {
				proxy := startFreezer(t, s.addr)
				url, cut = "redis://"+proxy.addr()+"/0", proxy.freeze
			}
			dir := t.TempDir()
			stderr, end := startWatched(t, "run", "--backend", url, "--ttl", "3s", "--kill-after", killAfter.String(),
				uniqueName(t), "--", "sh", "-c", groupScript, dir)
			var pids []int
			for _, f := range []string{"pid", "gpid"} {
				pid, err := strconv.Atoi(strings.TrimSpace(awaitFile(t, filepath.Join(dir, f))))
				if err != nil {
					t.Fatal(err)
				}
				pids = append(pids, pid)
				t.Cleanup(func() { killIfAlive(pid) })
			}
			cut()
			lost := stderr.await(t, "lost")
			r, at := end()
			t.Logf("exit %d, %v after the loss (--kill-after %v)", r.code, at.Sub(lost).Round(time.Millisecond), killAfter)
			r.want(t, exitLost, "a run cut off from its server")
			// Generous: the point is that no 10s release timeout is
			// waited out on the way.
			if took := at.Sub(lost); took > killAfter+5*time.Second {
				t.Errorf("lock run exited %v after declaring the loss, want about --kill-after (%v)", took, killAfter)
			}
			for _, pid := range pids {
				if processAlive(pid) {
					t.Errorf("process %d of the command's group is alive after lock run exited", pid)
				}
			}
		})
	}
}

// lock run's exit code for a failed Acquire goes by the error's class:
// only contention (lock.ErrLocked, a -w wait that ran out on a held name
// included) is -E's code; an outage, also one that ended a wait, is 69.
func TestAcquireFailedClass(t *testing.T) {
	expired, cancel := context.WithTimeout(context.Background(), 0)
	defer cancel()
	<-expired.Done()
	outage := errors.New("redislock: dial tcp 127.0.0.1:1: connect: connection refused")
	signalled, stop := context.WithCancelCause(context.Background())
	stop(signalError{syscall.SIGTERM})
	f := &runFlags{conflict: 42}
	f.wait.d = 2 * time.Second
	for _, c := range []struct {
		ctx  context.Context
		err  error
		code int
	}{
		{context.Background(), lock.ErrLocked, 42},
		{context.Background(), fmt.Errorf("redislock: %q: %w", "n", lock.ErrLocked), 42},
		{context.Background(), lock.NewWaitError(lock.ErrLocked, expired), 42},
		{context.Background(), outage, exitUnavailable},
		{context.Background(), fmt.Errorf("gave up waiting: %w: %w", context.DeadlineExceeded, outage), exitUnavailable},
		{context.Background(), context.DeadlineExceeded, exitUnavailable},
		{context.Background(), lock.ErrClosed, exitUnavailable},
		{context.Background(), fmt.Errorf("x: %w", lock.ErrLimitMismatch), exitUsage},
		{context.Background(), lock.ErrInvalidName, exitUsage},
		{signalled, lock.NewWaitError(lock.ErrLocked, signalled), 128 + int(syscall.SIGTERM)},
	} {
		if got := acquireFailed(c.ctx, c.err, f, "n", io.Discard); got != c.code {
			t.Errorf("%v: exit code %d, want %d", c.err, got, c.code)
		}
	}
}
