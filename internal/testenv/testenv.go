// Package testenv is what the family's integration tests share: service
// endpoints from the environment, the rule for missing services, the
// one wait for a condition, and helpers to run the test binary as a child
// process.
//
// go test -short runs every test that needs no server, and only those: a
// test that needs one, shared (Need) or started by the test itself (a
// private server to kill, a cluster), is skipped at once with a message,
// without trying to reach it. Without -short a shared server that cannot
// be reached skips its tests too, except where services are Required,
// where it fails them.
package testenv

import (
	"context"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"
)

// The endpoints come from the environment; the defaults are the private
// servers scripts/services.sh starts, on ports of their own so that the
// tests never use (or disturb) the machine's own servers.

// PostgresDSN is the connection string of the PostgreSQL database the tests use.
func PostgresDSN() string {
	return env("LOCK_TEST_POSTGRES_DSN", "postgres://postgres@127.0.0.1:25432/test?sslmode=disable")
}

// PgBouncerAddr is host:port of a PgBouncer in front of the database
// PostgresDSN names: its database "session" pools in session mode,
// "transaction" in transaction mode (as scripts/services.sh configures it).
func PgBouncerAddr() string { return env("LOCK_TEST_PGBOUNCER_ADDR", "127.0.0.1:26432") }

// RedisAddr is host:port of the Redis server the tests use.
func RedisAddr() string { return env("LOCK_TEST_REDIS_ADDR", "127.0.0.1:26379") }

// EtcdEndpoints are the etcd client endpoints the tests use.
func EtcdEndpoints() []string {
	return strings.Split(env("LOCK_TEST_ETCD_ENDPOINTS", "127.0.0.1:22379"), ",")
}

func env(key, dflt string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return dflt
}

// Required reports whether a missing service must fail the tests: under
// CI=true or LOCK_REQUIRE_SERVICES=1.
func Required() bool {
	return os.Getenv("CI") == "true" || os.Getenv("LOCK_REQUIRE_SERVICES") == "1"
}

// Unavailable ends the test because service could not be reached: a skip
// on a developer's machine, a failure where services are required.
func Unavailable(t testing.TB, service string, err error) {
	t.Helper()
	if Required() {
		t.Fatalf("%s unavailable (CI=true or LOCK_REQUIRE_SERVICES=1 makes this a failure; run scripts/services.sh up): %v", service, err)
	}
	t.Skipf("%s unavailable, skipping (run scripts/services.sh up): %v", service, err)
}

// PingTimeout bounds Ping: a server that has not answered by then is down
// as far as the tests are concerned.
const PingTimeout = 5 * time.Second

// Ping calls ping, a round trip to a server through a client of its driver
// (testenv imports none), with a deadline of PingTimeout under ctx.
func Ping(ctx context.Context, ping func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, PingTimeout)
	defer cancel()
	return ping(ctx)
}

// Need pings service and, when it does not answer, ends the test as
// Unavailable says; under -short it skips the test without pinging.
// Callers register the client's Close with t.Cleanup first, so that a
// skipped test closes it too.
func Need(t testing.TB, service string, ping func(ctx context.Context) error) {
	t.Helper()
	SkipShort(t, service)
	if err := Ping(context.Background(), ping); err != nil {
		Unavailable(t, service, err)
	}
}

// SkipShort skips t under -short: it needs a server, which what names (a
// shared service, or one the test starts: "a private redis-server").
func SkipShort(t testing.TB, what string) {
	t.Helper()
	if testing.Short() {
		t.Skipf("needs %s; -short runs only the tests that need no server", what)
	}
}

// ChildEnv is the variable that tells a re-executed test binary which child
// role to play.
const ChildEnv = "LOCK_TEST_CHILD"

// Child returns the role this process was started to play by Command, or "".
func Child() string { return os.Getenv(ChildEnv) }

// Spawner returns a function that makes commands running this program
// again as a child playing role: for a program (an example's main) what
// Command is for a test binary. Its main checks Child() first.
func Spawner(role string) (func() *exec.Cmd, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	return func() *exec.Cmd {
		cmd := exec.Command(self)
		cmd.Env = append(os.Environ(), ChildEnv+"="+role)
		return cmd
	}, nil
}

// Command returns a command that runs this test binary again as a child
// playing role: the child's TestMain (or test) checks Child() and acts.
// Only the named test runs, so the child does no other work.
func Command(t testing.TB, role, test string, env ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+test+"$", "-test.count=1")
	cmd.Env = append(append(os.Environ(), ChildEnv+"="+role), env...)
	return cmd
}

// ClosedAddr returns a loopback host:port nothing listens on (it was free a
// moment ago), for a client of a server that is down.
func ClosedAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// Eventually polls cond until it holds, failing t if it does not within
// d: the family's one wait for a state the test cannot be signalled of (a
// waiter queued in a store, a file written by a child). what says what
// was awaited. d is a guard against a hang, not a timing target: give it
// room on a loaded machine. A wait for something that has a channel (a
// holder's Done, a result) receives from it instead.
func Eventually(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	if !Poll(d, cond) {
		t.Fatalf("%s: not within %v", what, d)
	}
}

// Poll is Eventually for code that decides itself what a timeout means (a
// harness that reports it, a test that wants the last error in its
// message): it polls cond until it holds and reports whether it did
// within d. For the first millisecond it only yields between looks (what
// another goroutine is about to do shows at once), then sleeps 1ms, 2ms,
// up to 16ms: no hammering of a server or of the machine for what takes
// seconds.
func Poll(d time.Duration, cond func() bool) bool {
	start := time.Now()
	var every time.Duration
	for !cond() {
		switch since := time.Since(start); {
		case since > d:
			return false
		case since < time.Millisecond:
			runtime.Gosched()
		default:
			every = min(max(2*every, time.Millisecond), 16*time.Millisecond)
			time.Sleep(every)
		}
	}
	return true
}
