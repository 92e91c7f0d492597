//go:build unix

package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/ubgo/lock/internal/testenv"
)

// lockBin is the command under test, built once by TestMain with go build.
var lockBin string

func TestMain(m *testing.M) {
	if testenv.Child() == "check" {
		checkChild()
		return
	}
	dir, err := os.MkdirTemp("", "cmd-lock-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	lockBin = filepath.Join(dir, "lock")
	if out, err := exec.Command("go", "build", "-o", lockBin, ".").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "go build: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// checkChild is the command of a second lock run in the loss tests: it
// runs once that run holds the lock, and writes to $LOCK_TEST_RESULT
// whether any pid listed in the files $LOCK_TEST_PIDS (space-separated)
// names a process that is still alive.
func checkChild() {
	var alive []string
	for _, name := range strings.Fields(os.Getenv("LOCK_TEST_PIDS")) {
		b, err := os.ReadFile(name)
		if err != nil {
			alive = append(alive, fmt.Sprintf("unreadable %s: %v", name, err))
			continue
		}
		pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		if processAlive(pid) {
			alive = append(alive, strconv.Itoa(pid))
		}
	}
	result := "dead"
	if len(alive) > 0 {
		result = "alive " + strings.Join(alive, " ")
	}
	if err := os.WriteFile(os.Getenv("LOCK_TEST_RESULT"), []byte(result), 0o644); err != nil {
		os.Exit(1)
	}
}

// processAlive reports whether pid is a process that has not exited: one
// that exists and is no zombie (state Z, or X, in /proc/pid/stat).
func processAlive(pid int) bool {
	if pid <= 0 {
		return true // a pid file not yet written is not proof of death
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return syscall.Kill(pid, 0) == nil // no /proc: exists at all
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	return len(f) > 0 && f[0] != "Z" && f[0] != "X"
}

// uniqueName is a lock name no other test, or earlier run, uses: only
// [A-Za-z0-9_-], so that its keys are the name itself.
func uniqueName(t testing.TB) string {
	b := make([]byte, 4)
	rand.Read(b)
	n := strings.NewReplacer("/", "_", " ", "_", "#", "_").Replace(t.Name())
	return n + "-" + hex.EncodeToString(b)
}

// A result is how a lock command ended.
type result struct {
	code           int
	stdout, stderr string
}

// lockCmd returns an unstarted lock command with args, whose output goes
// to the returned buffers.
func lockCmd(args ...string) (*exec.Cmd, *bytes.Buffer, *bytes.Buffer) {
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(lockBin, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	// A process the command left behind keeps the output pipes open:
	// Wait returns this long after lock itself exited regardless.
	cmd.WaitDelay = 5 * time.Second
	return cmd, &stdout, &stderr
}

// runLock runs lock with args to its end (at most a minute).
func runLock(t *testing.T, args ...string) result {
	t.Helper()
	cmd, stdout, stderr := lockCmd(args...)
	return wait(t, cmd, stdout, stderr, cmd.Start())
}

func wait(t *testing.T, cmd *exec.Cmd, stdout, stderr *bytes.Buffer, err error) result {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err = <-done:
	case <-time.After(time.Minute):
		cmd.Process.Kill()
		<-done
		t.Fatalf("lock %s: still running after a minute; stderr:\n%s", strings.Join(cmd.Args[1:], " "), stderr)
	}
	if _, ok := err.(*exec.ExitError); err != nil && !ok {
		t.Fatal(err)
	}
	return result{cmd.ProcessState.ExitCode(), stdout.String(), stderr.String()}
}

// want fails t unless r ended with code.
func (r result) want(t *testing.T, code int, what string) {
	t.Helper()
	if r.code != code {
		t.Errorf("%s: exit code %d, want %d; stdout:\n%s\nstderr:\n%s", what, r.code, code, r.stdout, r.stderr)
	}
}

// awaitFile waits until the file name exists and is not empty, and
// returns its contents; it fails t after a generous deadline.
func awaitFile(t *testing.T, name string) string {
	t.Helper()
	var b []byte
	testenv.Eventually(t, time.Minute, name+": written", func() bool {
		b, _ = os.ReadFile(name)
		return len(b) > 0
	})
	return string(b)
}

// awaitContains waits until the file name contains every one of subs.
func awaitContains(t *testing.T, name string, subs ...string) {
	t.Helper()
	var b []byte
	missing := ""
	if !testenv.Poll(time.Minute, func() bool {
		b, _ = os.ReadFile(name)
		missing = ""
		for _, s := range subs {
			if !strings.Contains(string(b), s) {
				missing = s
				break
			}
		}
		return missing == ""
	}) {
		t.Fatalf("%s: no %q within a minute; it holds:\n%s", name, missing, b)
	}
}

// flockURL is a flock backend in a directory of the test's own.
func flockURL(t *testing.T) string { return "flock://" + t.TempDir() }

// fileURL is a filelock backend in a directory of the test's own.
func fileURL(t *testing.T) string { return "file://" + t.TempDir() }

// redisURL is the test Redis server, or the test ends as testenv says.
func redisURL(t *testing.T) string {
	redisClient(t)
	return "redis://" + testenv.RedisAddr() + "/0"
}

// redisClient is a client of the test Redis server, for the test's own
// look at keys.
func redisClient(t *testing.T) *redis.Client {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr()})
	t.Cleanup(func() { rdb.Close() })
	testenv.Need(t, "redis", func(ctx context.Context) error { return rdb.Ping(ctx).Err() })
	return rdb
}

// postgresURL is the test database, or the test ends as testenv says.
func postgresURL(t *testing.T) string {
	t.Helper()
	dsn := testenv.PostgresDSN()
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	testenv.Need(t, "postgres", pool.Ping)
	return dsn
}

// etcdURL is the test etcd cluster, or the test ends as testenv says.
func etcdURL(t *testing.T) string {
	t.Helper()
	eps := testenv.EtcdEndpoints()
	cli, err := clientv3.New(clientv3.Config{Endpoints: eps, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	testenv.Need(t, "etcd", func(ctx context.Context) error {
		_, err := cli.Status(ctx, eps[0])
		return err
	})
	return "etcd://" + strings.Join(eps, ",")
}

// backends are every kind of backend URL, each made for a test.
var backends = []struct {
	kind string
	url  func(t *testing.T) string
}{
	{"flock", flockURL},
	{"filelock", fileURL},
	{"pglock", postgresURL},
	{"redislock", redisURL},
	{"etcdlock", etcdURL},
}

// inspectJSON runs lock inspect --json and decodes its answer.
func inspectJSON(t *testing.T, url, name string, extra ...string) jsonInfo {
	t.Helper()
	r := runLock(t, append(append([]string{"inspect", "--backend", url, "--json"}, extra...), name)...)
	r.want(t, 0, "inspect --json")
	var info jsonInfo
	if err := json.Unmarshal([]byte(r.stdout), &info); err != nil {
		t.Fatalf("inspect --json: %v in %q", err, r.stdout)
	}
	return info
}

// holdLock starts lock run on name whose command writes $LOCK_TOKEN to a
// file and then waits for its stdin to close; it returns once the command
// runs, with the token, and a func that ends the command and returns how
// lock run ended.
func holdLock(t *testing.T, url, name string, flags ...string) (token string, end func() result) {
	t.Helper()
	ready := filepath.Join(t.TempDir(), "token")
	args := append(append([]string{"run", "--backend", url}, flags...), name, "--", "sh", "-c", `echo "$LOCK_TOKEN" > "$0.tmp" && mv "$0.tmp" "$0"; cat >/dev/null`, ready)
	cmd, stdout, stderr := lockCmd(args...)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ended := false
	end = func() result {
		ended = true
		stdin.Close()
		return wait(t, cmd, stdout, stderr, nil)
	}
	t.Cleanup(func() {
		if !ended {
			end()
		}
	})
	return strings.TrimSpace(awaitFile(t, ready)), end
}

// decode unmarshals the JSON s into v.
func decode(t *testing.T, s string, v any) {
	t.Helper()
	if err := json.Unmarshal([]byte(s), v); err != nil {
		t.Fatalf("%v in %q", err, s)
	}
}
