//go:build unix

package main

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ubgo/lock/internal/testenv"
)

// On every backend, the command runs with LOCK_NAME, LOCK_TOKEN (the
// token the backend reports for the holder) and LOCK_BACKEND, and lock
// run exits with its status.
func TestRunEnv(t *testing.T) {
	for _, be := range backends {
		t.Run(be.kind, func(t *testing.T) {
			url, name := be.url(t), uniqueName(t)
			out := filepath.Join(t.TempDir(), "env")
			script := `printf '%s\n%s\n%s\n' "$LOCK_NAME" "$LOCK_TOKEN" "$LOCK_BACKEND" > "$1"
"$0" inspect "$LOCK_NAME" --backend "$LOCK_BACKEND" --json > "$1.json" || exit 99
exit 7`
			r := runLock(t, "run", "--backend", url, name, "--", "sh", "-c", script, lockBin, out)
			r.want(t, 7, "run")
			env := strings.Split(awaitFile(t, out), "\n")
			if len(env) < 3 || env[0] != name || env[2] != url {
				t.Fatalf("LOCK_NAME, LOCK_TOKEN, LOCK_BACKEND = %q, want %q, a token, %q", env, name, url)
			}
			tok, err := strconv.ParseUint(env[1], 10, 64)
			if err != nil || tok == 0 {
				t.Fatalf("LOCK_TOKEN = %q, want a token > 0", env[1])
			}
			var info jsonInfo
			decode(t, awaitFile(t, out+".json"), &info)
			if len(info.Holders) != 1 || info.Holders[0].Token != tok || !strings.Contains(info.Holders[0].Owner, "@") {
				t.Errorf("inspect while the command ran: %+v, want one holder with token %d and owner pid@host", info, tok)
			}
			if info := inspectJSON(t, url, name); len(info.Holders) != 0 {
				t.Errorf("after the run: %+v, want the lock released", info)
			}
		})
	}
}

// LOCK_BACKEND stands for --backend.
func TestRunBackendFromEnv(t *testing.T) {
	cmd, stdout, stderr := lockCmd("run", uniqueName(t), "--", "sh", "-c", `echo "$LOCK_BACKEND"`)
	url := flockURL(t)
	cmd.Env = append(os.Environ(), "LOCK_BACKEND="+url)
	r := wait(t, cmd, stdout, stderr, cmd.Start())
	r.want(t, 0, "run with LOCK_BACKEND")
	if strings.TrimSpace(r.stdout) != url {
		t.Errorf("the command saw LOCK_BACKEND=%q, want %q", r.stdout, url)
	}

	cmd, stdout, stderr = lockCmd("run", "x", "--", "true")
	cmd.Env = withoutEnv("LOCK_BACKEND")
	r = wait(t, cmd, stdout, stderr, cmd.Start())
	r.want(t, exitUsage, "run without a backend")
	if !strings.Contains(r.stderr, "LOCK_BACKEND") {
		t.Errorf("stderr %q does not say how to name a backend", r.stderr)
	}
}

func withoutEnv(key string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, key+"=") {
			env = append(env, kv)
		}
	}
	return env
}

// The command's exit status passes through; a death by signal n is
// 128+n; a command that cannot run is 126 or 127.
func TestRunExitStatus(t *testing.T) {
	url := flockURL(t)
	notExec := filepath.Join(t.TempDir(), "script")
	if err := os.WriteFile(notExec, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		argv []string
		code int
	}{
		{[]string{"true"}, 0},
		{[]string{"sh", "-c", "exit 3"}, 3},
		{[]string{"sh", "-c", "exit 255"}, 255},
		{[]string{"sh", "-c", "kill -TERM $$"}, 128 + int(syscall.SIGTERM)},
		{[]string{"sh", "-c", "kill -KILL $$"}, 128 + int(syscall.SIGKILL)},
		{[]string{"sh", "-c", "kill -USR1 $$"}, 128 + int(syscall.SIGUSR1)},
		{[]string{"no-such-command-" + uniqueName(t)}, exitNotFound},
		{[]string{notExec}, exitCannotRun},
	} {
		r := runLock(t, append([]string{"run", "--backend", url, uniqueName(t), "--"}, c.argv...)...)
		r.want(t, c.code, strings.Join(c.argv, " "))
	}
}

// SIGHUP, SIGINT and SIGTERM sent to lock run reach the command and the
// processes it started (its process group).
func TestRunForwardsSignals(t *testing.T) {
	url, name := flockURL(t), uniqueName(t)
	dir := t.TempDir()
	log := filepath.Join(dir, "log")
	// sh runs a trap only between commands: the loops of short sleeps
	// keep both shells responsive. (A background job of sh ignores
	// SIGINT, so only the child traps it.)
	script := `D=$0
trap 'echo child-HUP >> $D/log' HUP
trap 'echo child-INT >> $D/log' INT
trap 'echo child-TERM >> $D/log; exit 5' TERM
sh -c 'trap "echo grand-HUP >> $0/log" HUP; trap "echo grand-TERM >> $0/log; exit 0" TERM; echo $$ > $0/gpid; while :; do sleep 0.05; done' $D &
while [ ! -s $D/gpid ]; do sleep 0.01; done
echo $$ > $D/ready
while :; do sleep 0.05; done`
	cmd, stdout, stderr := lockCmd("run", "--backend", url, name, "--", "sh", "-c", script, dir)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	awaitFile(t, filepath.Join(dir, "ready"))
	cmd.Process.Signal(syscall.SIGHUP)
	awaitContains(t, log, "child-HUP", "grand-HUP")
	cmd.Process.Signal(syscall.SIGINT)
	awaitContains(t, log, "child-INT")
	cmd.Process.Signal(syscall.SIGTERM)
	r := wait(t, cmd, stdout, stderr, nil)
	r.want(t, 5, "run ended by SIGTERM, which the command trapped")
	awaitContains(t, log, "child-TERM", "grand-TERM")
	if info := inspectJSON(t, url, name); len(info.Holders) != 0 {
		t.Errorf("after the run: %+v, want the lock released", info)
	}
}

// A held name: -n (the default) fails at once with 1, or -E's code; -w
// waits, and ends with the same code when it runs out.
func TestRunConflict(t *testing.T) {
	for _, be := range []struct {
		kind string
		url  func(*testing.T) string
	}{{"flock", flockURL}, {"redislock", redisURL}} {
		t.Run(be.kind, func(t *testing.T) {
			url, name := be.url(t), uniqueName(t)
			tok, end := holdLock(t, url, name)
			for _, c := range []struct {
				flags []string
				code  int
				says  string
			}{
				{nil, exitConflict, "is held"},
				{[]string{"-n"}, exitConflict, "is held"},
				{[]string{"-E", "42"}, 42, ""}, // -E: silent, as flock(1)
				{[]string{"-n", "-E", "0"}, 0, ""},
				{[]string{"-w", "300ms"}, exitConflict, "still held after waiting 300ms"},
				{[]string{"-w", "0.3"}, exitConflict, "still held after waiting 300ms"}, // flock(1)'s seconds
				{[]string{"-w", "0.3", "-E", "9"}, 9, ""},
			} {
				r := runLock(t, append(append([]string{"run", "--backend", url}, c.flags...), name, "--", "sh", "-c", "echo ran")...)
				r.want(t, c.code, strings.Join(c.flags, " "))
				if strings.Contains(r.stdout, "ran") || !strings.Contains(r.stderr, c.says) || c.says == "" && r.stderr != "" {
					t.Errorf("run %v: stdout %q, stderr %q; want no run and %q", c.flags, r.stdout, r.stderr, c.says)
				}
			}

			// A waiter gets the lock once the holder is done, with a
			// larger token.
			waiter, stdout, stderr := lockCmd("run", "--backend", url, "-w", "1m", name, "--", "sh", "-c", `echo "$LOCK_TOKEN"`)
			if err := waiter.Start(); err != nil {
				t.Fatal(err)
			}
			end().want(t, 0, "holder")
			r := wait(t, waiter, stdout, stderr, nil)
			r.want(t, 0, "waiter")
			if next, _ := strconv.ParseUint(strings.TrimSpace(r.stdout), 10, 64); next <= mustUint(t, tok) {
				t.Errorf("the waiter's token %q is not above the holder's %s", r.stdout, tok)
			}
		})
	}
	r := runLock(t, "run", "--backend", flockURL(t), "-n", "-w", "1s", "x", "--", "true")
	r.want(t, exitUsage, "-n with -w")
}

func mustUint(t *testing.T, s string) uint64 {
	t.Helper()
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// --max-concurrent N admits N holders; a caller with another N is told.
func TestRunMaxConcurrent(t *testing.T) {
	url, name := redisURL(t), uniqueName(t)
	holdLock(t, url, name, "--max-concurrent", "2")
	holdLock(t, url, name, "--max-concurrent", "2")
	runLock(t, "run", "--backend", url, "--max-concurrent", "2", name, "--", "true").want(t, exitConflict, "third of 2")
	r := runLock(t, "run", "--backend", url, "--max-concurrent", "3", name, "--", "true")
	r.want(t, exitUsage, "another limit")
	if !strings.Contains(r.stderr, "limit") {
		t.Errorf("stderr %q does not name the limit mismatch", r.stderr)
	}
	if info := inspectJSON(t, url, name); info.Limit != 2 || len(info.Holders) != 2 {
		t.Errorf("inspect: %+v, want 2 holders of a limit of 2", info)
	}
}

// --ttl sets the lease, --owner what inspect shows; a lease on flock is
// refused.
func TestRunTTLAndOwner(t *testing.T) {
	url, name := redisURL(t), uniqueName(t)
	holdLock(t, url, name, "--ttl", "7s", "--owner", "job-42")
	now := time.Now()
	info := inspectJSON(t, url, name)
	if len(info.Holders) != 1 || info.Holders[0].Owner != "job-42" || info.Holders[0].Expires == nil {
		t.Fatalf("inspect: %+v, want one holder job-42 with an expiry", info)
	}
	// The default TTL is 30s: an expiry more than 7s (and a little clock
	// rounding) away would be the default's.
	if left := info.Holders[0].Expires.Sub(now); left > 7500*time.Millisecond || left <= 0 {
		t.Errorf("lease expires in %v, want at most the 7s of --ttl", left)
	}
	r := runLock(t, "run", "--backend", flockURL(t), "--ttl", "5s", "x", "--", "true")
	r.want(t, exitUsage, "--ttl on flock")
	if !strings.Contains(r.stderr, "no lease") {
		t.Errorf("stderr %q does not say flock has no lease", r.stderr)
	}
}

// A URL that names no backend exits 78, one whose server does not answer
// 69, each with a message that says so.
func TestRunBadBackend(t *testing.T) {
	for _, url := range []string{
		"nowhere",
		"ftp://x/y",
		"flock://host/dir",
		"flock:///no/such/dir/" + uniqueName(t),
		"file://",
		"redis://127.0.0.1:1/notanumber",
		"redis://127.0.0.1:1/0?bogus_option=1",
		"redis+cluster://a:1,,b:2",
		"redis+cluster://a:1/3",
		"etcd://h:1/path",
		"postgres://u@h:notaport/db",
	} {
		r := runLock(t, "run", "--backend", url, "x", "--", "true")
		r.want(t, exitBadURL, url)
		if !strings.Contains(r.stderr, "bad backend URL") {
			t.Errorf("%s: stderr %q does not say the URL is bad", url, r.stderr)
		}
	}
	// Each of these waits out its client's connect timeout: side by side.
	closed := testenv.ClosedAddr(t)
	t.Run("unreachable", func(t *testing.T) {
		for service, url := range map[string]string{
			"redis":    "redis://" + closed + "/0",
			"postgres": "postgres://postgres@" + closed + "/test?sslmode=disable",
			"etcd":     "etcd://" + closed,
		} {
			t.Run(service, func(t *testing.T) {
				t.Parallel()
				r := runLock(t, "run", "--backend", url, "x", "--", "true")
				r.want(t, exitUnavailable, url)
				if !strings.Contains(r.stderr, "unreachable") {
					t.Errorf("%s: stderr %q does not say the server is unreachable", url, r.stderr)
				}
			})
		}
		t.Run("password", func(t *testing.T) {
			t.Parallel()
			r := runLock(t, "run", "--backend", "redis://u:secret@"+closed+"/0", "x", "--", "true")
			if strings.Contains(r.stderr, "secret") {
				t.Errorf("the password shows in %q", r.stderr)
			}
		})
	})
}

// A command without its "--", a bad flag value, an unknown command: usage
// errors. Flags may come after the name (up to the "--").
func TestRunUsage(t *testing.T) {
	url := flockURL(t)
	runLock(t, "run", "x", "--backend", url, "-w", "1s", "--", "true").want(t, 0, "run with flags after the name")
	for _, args := range [][]string{
		{"run", "--backend", url, "x", "true"},
		{"run", "--backend", url, "x", "-w", "1s", "true"},
		{"run", "--backend", url, "x", "--"},
		{"run", "--backend", url, "-E", "256", "x", "--", "true"},
		{"run", "--backend", url, "-w", "soon", "x", "--", "true"},
		{"run", "--backend", url, "--max-concurrent", "0", "x", "--", "true"},
		{"frobnicate"},
		{},
	} {
		runLock(t, args...).want(t, exitUsage, strings.Join(args, " "))
	}
	r := runLock(t, "help")
	r.want(t, 0, "help")
	for _, s := range []string{"lock run", "flock:///dir", "redis+cluster://", "etcd://", "75", "78", "--kill-after"} {
		if !strings.Contains(r.stdout, s) {
			t.Errorf("help does not mention %q", s)
		}
	}
}

// A signal while lock run waits for the lock ends the wait, leaves no
// waiter behind, and lock exits as if killed by it. (etcd counts waiters,
// so the test knows when the run waits.)
func TestRunSignalWhileWaiting(t *testing.T) {
	url, name := etcdURL(t), uniqueName(t)
	holdLock(t, url, name)
	waiter, stdout, stderr := lockCmd("run", "--backend", url, "-w", "1m", name, "--", "sh", "-c", "echo ran")
	if err := waiter.Start(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, time.Minute, "the waiter counted", func() bool { return inspectJSON(t, url, name).Waiting == 1 })
	waiter.Process.Signal(syscall.SIGTERM)
	r := wait(t, waiter, stdout, stderr, nil)
	r.want(t, 128+int(syscall.SIGTERM), "waiter sent SIGTERM")
	if strings.Contains(r.stdout, "ran") || !strings.Contains(r.stderr, "interrupted") {
		t.Errorf("stdout %q, stderr %q: want no run and the interruption", r.stdout, r.stderr)
	}
	if info := inspectJSON(t, url, name); info.Waiting != 0 || len(info.Holders) != 1 {
		t.Errorf("after the waiter left: %+v, want the holder and no waiter", info)
	}
}

// A conflict with -E or -q prints nothing: cron mails any output.
func TestRunQuietConflict(t *testing.T) {
	url, name := flockURL(t), uniqueName(t)
	holdLock(t, url, name)
	for _, flags := range [][]string{{"-E", "0"}, {"-q"}, {"-E", "3", "-w", "100ms"}} {
		args := append(append([]string{"run", "--backend", url}, flags...), name, "--", "true")
		r := runLock(t, args...)
		want := 1
		if flags[0] == "-E" {
			want = int(mustUint(t, flags[1]))
		}
		r.want(t, want, strings.Join(flags, " "))
		if r.stderr != "" || r.stdout != "" {
			t.Errorf("%s: a conflict printed %q %q; want nothing", strings.Join(flags, " "), r.stdout, r.stderr)
		}
	}
	r := runLock(t, "run", "--backend", url, name, "--", "true")
	r.want(t, 1, "no -E")
	if !strings.Contains(r.stderr, "is held") {
		t.Errorf("without -E or -q the conflict says nothing: %q", r.stderr)
	}
}
