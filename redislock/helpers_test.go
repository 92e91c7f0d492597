package redislock

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/ubgo/lock/internal/testenv"
)

// testPrefix keeps the tests' keys apart from anything else on the shared
// server.
const testPrefix = "redislock-test:"

// newClient connects to the shared test server, or ends the test as the
// family's rule says when it cannot be reached.
func newClient(t testing.TB) *redis.Client {
	t.Helper()
	return dial(t, testenv.RedisAddr())
}

func dial(t testing.TB, addr string) *redis.Client {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { rdb.Close() })
	testenv.Need(t, "redis", func(ctx context.Context) error { return rdb.Ping(ctx).Err() })
	return rdb
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// uniq returns a lock name no earlier run has used.
func uniq(t testing.TB, suffix string) string {
	return fmt.Sprintf("%s/%x/%s", t.Name(), time.Now().UnixNano(), suffix)
}

// server is a private redis-server on a free port, for tests that pause,
// kill or restart it. It runs without persistence, like the shared one.
type server struct {
	t     testing.TB
	port  int
	dir   string // its working directory: a replica writes the primary's data there
	cmd   *exec.Cmd
	extra []string
}

func startServer(t testing.TB, extra ...string) *server {
	t.Helper()
	testenv.SkipShort(t, "a private redis-server")
	if _, err := exec.LookPath("redis-server"); err != nil {
		testenv.Unavailable(t, "redis-server binary", err)
	}
	return startServerOn(t, freePort(t), extra...)
}

// freePort returns a loopback port that was free a moment ago.
func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// startServerOn is startServer on a given port, which must be free.
func startServerOn(t testing.TB, port int, extra ...string) *server {
	t.Helper()
	testenv.SkipShort(t, "a private redis-server")
	if _, err := exec.LookPath("redis-server"); err != nil {
		testenv.Unavailable(t, "redis-server binary", err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		t.Fatalf("port %d for a private redis-server: %v", port, err)
	}
	l.Close()
	s := &server{t: t, port: port, dir: t.TempDir(), extra: extra}
	s.start()
	t.Cleanup(s.stop)
	return s
}

func (s *server) addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

func (s *server) start() {
	s.t.Helper()
	args := append([]string{"--port", strconv.Itoa(s.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", s.dir, "--logfile", ""}, s.extra...)
	s.cmd = exec.Command("redis-server", args...)
	s.cmd.Stdout, s.cmd.Stderr = nil, nil
	if err := s.cmd.Start(); err != nil {
		s.t.Fatalf("start redis-server: %v", err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: s.addr(), MaxRetries: -1})
	defer rdb.Close()
	var err error
	if !testenv.Poll(10*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		err = rdb.Ping(ctx).Err()
		return err == nil
	}) {
		s.stop()
		s.t.Fatalf("private redis-server on %s did not start: %v", s.addr(), err)
	}
}

// kill ends the server at once, losing everything it held.
func (s *server) kill() {
	if s.cmd != nil && s.cmd.Process != nil {
		s.cmd.Process.Signal(syscall.SIGKILL)
		s.cmd.Wait()
		s.cmd = nil
	}
}

func (s *server) stop() { s.kill() }

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// stall makes h behave like a holder whose process is paused: its own
// clock no longer runs for it (no renewal, no deadline), while the lock
// runs out on the server.
func stall(h *Holder) {
	h.f.rn.mu.Lock()
	defer h.f.rn.mu.Unlock()
	h.f.rn.dropLocked(h)
}

// numsub reports how many connections are subscribed to ch.
func numsub(t testing.TB, rdb *redis.Client, ch string) int64 {
	t.Helper()
	m, err := rdb.PubSubNumSub(ctx0(), ch).Result()
	if err != nil {
		t.Fatal(err)
	}
	return m[ch]
}

func ctx0() context.Context { return context.Background() }

// testFactory returns a factory on rdb under the test prefix, without a
// logger, closed at cleanup.
func testFactory(t testing.TB, rdb *redis.Client, opts ...Option) *Factory {
	f := NewFactory(rdb, append([]Option{WithKeyPrefix(testPrefix), WithLogger(nil)}, opts...)...)
	t.Cleanup(func() { f.Close() })
	return f
}
