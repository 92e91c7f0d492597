//go:build unix

package main

import (
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/ubgo/lock/internal/testenv"
)

// groupScript is a command that ignores SIGTERM, as does the grandchild it
// starts, so that only SIGKILL ends them: it writes its pid to $0/pid and
// the grandchild's to $0/gpid, then waits.
const groupScript = `trap '' TERM
echo "$LOCK_TOKEN" > "$0/token"
sleep 1000 &
echo $! > "$0/gpid.tmp" && mv "$0/gpid.tmp" "$0/gpid"
echo $$ > "$0/pid.tmp" && mv "$0/pid.tmp" "$0/pid"
wait`

// startGroup starts lock run with flags on name running groupScript, and
// returns once both pids are written: a func that waits for lock run's
// end, the pids, the script's directory and lock run's process.
func startGroup(t *testing.T, url, name string, flags ...string) (run func() result, pids []int, dir string, p *os.Process) {
	t.Helper()
	dir = t.TempDir()
	args := append(append([]string{"run", "--backend", url}, flags...), name, "--", "sh", "-c", groupScript, dir)
	cmd, stdout, stderr := lockCmd(args...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	var r result
	run = func() result {
		once.Do(func() { r = wait(t, cmd, stdout, stderr, nil) })
		return r
	}
	t.Cleanup(func() {
		for _, pid := range pids {
			killIfAlive(pid)
		}
		cmd.Process.Kill()
		run()
	})
	for _, f := range []string{"pid", "gpid"} {
		pid, err := strconv.Atoi(strings.TrimSpace(awaitFile(t, filepath.Join(dir, f))))
		if err != nil {
			t.Fatal(err)
		}
		pids = append(pids, pid)
	}
	return run, pids, dir, cmd.Process
}

func killIfAlive(pid int) {
	if p, err := os.FindProcess(pid); err == nil && processAlive(pid) {
		p.Kill()
	}
}

// A Redis key deleted behind lock run's back (an operator's DEL): at its
// next renewal the holder finds the lock gone, and lock run kills the
// command's whole group — a grandchild that ignores SIGTERM included,
// with SIGKILL after --kill-after — and exits 75.
func TestLossByDelete(t *testing.T) {
	rdb := redisClient(t)
	url, name := redisURL(t), uniqueName(t)
	run, pids, _, _ := startGroup(t, url, name, "--ttl", "3s", "--kill-after", "200ms")
	if n, err := rdb.Del(context.Background(), "lock:{"+name+"}:lock").Result(); err != nil || n != 1 {
		t.Fatalf("DEL of the lock's key: %d, %v", n, err)
	}
	r := run()
	r.want(t, exitLost, "run whose key was deleted")
	if !strings.Contains(r.stderr, "lost") {
		t.Errorf("stderr %q does not say the lock was lost", r.stderr)
	}
	for _, pid := range pids {
		if processAlive(pid) {
			t.Errorf("process %d of the command's group is alive after lock run exited", pid)
		}
	}
	runLock(t, "run", "--backend", url, name, "--", "true").want(t, 0, "the next run")
}

// A holder that cannot reach Redis (its network path freezes) declares the
// lock lost before the lease runs out on the server, and lock run has the
// command's whole group killed — grandchild included, SIGTERM ignored —
// within the default --kill-after, before a second lock run, waiting for
// the name on a working connection, is granted it. The second run's
// command itself checks, as it starts, that every process of the first
// group is gone.
func TestLossBeforeSuccessor(t *testing.T) {
	redisClient(t)
	proxy := startFreezer(t, testenv.RedisAddr())
	name := uniqueName(t)
	first, _, dir, _ := startGroup(t, "redis://"+proxy.addr()+"/0", name, "--ttl", "5s")

	resultFile := filepath.Join(dir, "result")
	second, stdout, stderr := lockCmd("run", "--backend", redisURL(t), "-w", "1m", name, "--", os.Args[0])
	second.Env = append(os.Environ(),
		testenv.ChildEnv+"=check",
		"LOCK_TEST_PIDS="+filepath.Join(dir, "pid")+" "+filepath.Join(dir, "gpid"),
		"LOCK_TEST_RESULT="+resultFile)
	if err := second.Start(); err != nil {
		t.Fatal(err)
	}
	proxy.freeze()

	r := wait(t, second, stdout, stderr, nil)
	r.want(t, 0, "the second run")
	if got := awaitFile(t, resultFile); got != "dead" {
		t.Errorf("when the second run's command started, the first group's processes were %s, want dead", got)
	}
	first().want(t, exitLost, "the first run, cut off from Redis")
}

// A holder that is stopped (SIGSTOP) cannot renew, nor kill its command:
// its lease runs out on the server, and a second run gets the lock, with a
// larger token, while the first command still runs — only fencing protects
// a resource from it then. Once the first lock run runs again, it finds the
// lock lost, kills the whole group and exits 75.
func TestLossWhilePaused(t *testing.T) {
	url, name := redisURL(t), uniqueName(t)
	first, pids, dir, cmd := startGroup(t, url, name, "--ttl", "2s")
	testenv.Pause(t, cmd)
	resumed := false
	t.Cleanup(func() {
		if !resumed {
			testenv.Resume(cmd)
		}
	})

	tokFile := filepath.Join(t.TempDir(), "token")
	runLock(t, "run", "--backend", url, "-w", "1m", name, "--", "sh", "-c", `echo "$LOCK_TOKEN" > "$0"`, tokFile).want(t, 0, "the second run")
	if next, old := mustUint(t, strings.TrimSpace(awaitFile(t, tokFile))), mustUint(t, strings.TrimSpace(awaitFile(t, filepath.Join(dir, "token")))); next <= old {
		t.Errorf("the second holder's token %d is not above the paused one's %d", next, old)
	}
	resumed = true
	testenv.Resume(cmd)
	first().want(t, exitLost, "the paused run, resumed")
	for _, pid := range pids {
		if processAlive(pid) {
			t.Errorf("process %d of the paused run's group is alive after it exited", pid)
		}
	}
}

// A freezer is a TCP proxy whose traffic can be stopped at once in both
// directions, connections left open: to its clients the server seems
// paused.
type freezer struct {
	l      net.Listener
	frozen chan struct{}
	once   sync.Once
	mu     sync.Mutex
	conns  []net.Conn
}

func startFreezer(t *testing.T, upstream string) *freezer {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &freezer{l: l, frozen: make(chan struct{})}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", upstream)
			if err != nil {
				c.Close()
				continue
			}
			f.mu.Lock()
			f.conns = append(f.conns, c, up)
			f.mu.Unlock()
			go f.pipe(up, c)
			go f.pipe(c, up)
		}
	}()
	t.Cleanup(func() {
		l.Close()
		f.freeze()
		f.mu.Lock()
		defer f.mu.Unlock()
		for _, c := range f.conns {
			c.Close()
		}
	})
	return f
}

func (f *freezer) addr() string { return f.l.Addr().String() }

// freeze stops all traffic; new connections are accepted and then hang.
func (f *freezer) freeze() { f.once.Do(func() { close(f.frozen) }) }

// pipe copies from src to dst until frozen, then holds what it reads.
func (f *freezer) pipe(dst io.Writer, src io.Reader) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		select {
		case <-f.frozen:
			return
		default:
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
