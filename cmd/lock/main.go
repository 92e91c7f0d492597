//go:build unix

// Command lock runs a command under a named lock, and shows and frees
// locks, on any backend of github.com/ubgo/lock named by a URL.
//
//	lock run [flags] NAME -- CMD [ARGS...]
//	lock inspect [flags] NAME
//	lock ls [flags] [PREFIX]
//	lock break [flags] NAME
//
// Run "lock help" for the flags, the backend URLs and the exit codes. The
// guide has the details:
// https://github.com/ubgo/lock/blob/main/docs/guides/cmd-lock.md
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
)

// Exit codes of lock itself. run passes the child's status through
// instead, when the child ran and the lock was not lost.
const (
	exitConflict    = 1   // the lock is held by someone else (run -E changes it)
	exitNotHeld     = 1   // break: nothing holds the name
	exitUsage       = 64  // bad flags or arguments (sysexits EX_USAGE)
	exitUnavailable = 69  // the server could not be reached or failed (EX_UNAVAILABLE)
	exitLost        = 75  // run: the lock was lost while the command ran (EX_TEMPFAIL)
	exitRefused     = 77  // break: the backend cannot free a lock safely (EX_NOPERM)
	exitBadURL      = 78  // the backend URL is malformed or names no backend (EX_CONFIG)
	exitCannotRun   = 126 // run: the command was found but could not be started
	exitNotFound    = 127 // run: the command was not found
)

const usage = `lock runs a command under a named lock, and shows and frees locks,
on any backend of github.com/ubgo/lock.

Usage:
  lock run [flags] NAME -- CMD [ARGS...]   run CMD while holding NAME
  lock inspect [flags] NAME                who holds NAME
  lock ls [flags] [PREFIX]                 the held names starting with PREFIX
  lock break [flags] NAME                  free NAME whose holder is gone
  lock help                                this text

Every subcommand takes:
  --backend URL      the backend (default: $LOCK_BACKEND):
                       flock:///dir                   flock, lock files in dir
                       file:///dir                    filelock, marker files in dir
                       postgres://... postgresql://...  pglock (a pgx connection string)
                       redis://host:port/db  rediss://...  redislock (go-redis ParseURL)
                       redis+cluster://h1:port,h2:port  rediss+cluster://...
                                                      redislock on a Redis Cluster;
                                                      go-redis cluster options as query
                       etcd://h1:2379,h2:2379  etcds://...  etcdlock
  --key-prefix P     the backend's key prefix (WithKeyPrefix; redis, postgres, etcd)

lock run takes the lock, runs CMD in a process group of its own with
LOCK_NAME, LOCK_TOKEN (the fencing token) and LOCK_BACKEND in its
environment, forwards SIGINT, SIGTERM and SIGHUP to the group, renews the
lease while CMD runs, releases the lock when CMD exits and exits with CMD's
status (128+n if a signal n killed it). If the lock is lost, the whole group
gets SIGTERM at once and SIGKILL after --kill-after, and lock exits 75.
  -n                 fail at once if NAME is held (the default)
  -w DURATION        wait up to DURATION for NAME (5s, 1m; a bare number is seconds)
  -E CODE            exit code when NAME is held or -w runs out (default 1),
                     and no message then, as flock(1)
  -q                 no message when NAME is held or -w runs out
  --ttl DURATION     lease length (redis, etcd: whole seconds, file); default the backend's
  --max-concurrent N a semaphore of N permits; every holder must pass the same N
  --owner S          shown by inspect and ls (default pid@host)
  --kill-after D     SIGKILL this long after SIGTERM on loss (default TTL/20, at most 1s)

Flags may come before or after NAME (lock run: before the --). lock prints
its own one-line messages on stderr; the library's logs stay off it.

lock inspect and lock ls print a table, or with --json one JSON object per
name and line.

lock break frees NAME whoever holds it (file, redis, etcd; it refuses on
flock and postgres, whose locks end only with their holder): it shows the
holders and asks for confirmation unless --yes. The next holder's token is
larger, and a fence kept under NAME in the same store rejects the freed
holders' tokens from then on.

Exit codes:
  0..255  lock run: the command's exit status (a signal n: 128+n)
  1       the lock is held by someone else, or -w ran out (-E changes it);
          lock break: nothing holds NAME
  64      bad flags or arguments
  69      the server could not be reached, failed, or did not answer in time
          (also during a -w wait: an outage is never "held")
  75      lock run: the lock was lost while the command ran
  77      lock break: refused (the backend cannot free the lock safely),
          not confirmed, or the holders changed while it asked
  78      bad backend URL
  126     lock run: the command could not be started
  127     lock run: the command was not found
`

func main() { os.Exit(lockMain(os.Args[1:], os.Stdin, os.Stdout, os.Stderr)) }

// lockMain runs the subcommand args names and returns the exit code.
func lockMain(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitUsage
	}
	cmd, args := args[0], args[1:]
	switch cmd {
	case "run":
		return runCmd(args, stderr)
	case "inspect":
		return inspectCmd(args, stdout, stderr)
	case "ls":
		return lsCmd(args, stdout, stderr)
	case "break":
		return breakCmd(args, stdin, stdout, stderr)
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	}
	fmt.Fprintf(stderr, "lock: unknown subcommand %q (run 'lock help')\n", cmd)
	return exitUsage
}

// common are the flags of every subcommand.
type common struct {
	backend string
	prefix  string
}

// flags returns the flag set of subcommand name with the common flags
// registered into c.
func flags(name string, c *common, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("lock "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprintf(stderr, "usage: see 'lock help'\n") }
	fs.StringVar(&c.backend, "backend", os.Getenv("LOCK_BACKEND"), "backend URL (default $LOCK_BACKEND)")
	fs.StringVar(&c.prefix, "key-prefix", "", "the backend's key prefix")
	return fs
}

// usageError is a mistake in the command line.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error {
	return &usageError{fmt.Sprintf(format, args...)}
}

// parse parses args into fs and checks the backend is set and the number
// of positional arguments is within [min, max].
// parse parses args into fs and returns the positional arguments, between
// min and max of them (max < 0: no limit). Flags go before or after the
// positional arguments, up to a "--", which is kept with what follows it
// (lock run's command).
func parse(fs *flag.FlagSet, c *common, args []string, min, max int) ([]string, error) {
	var pos, rest []string
	if i := slices.Index(args, "--"); i >= 0 {
		args, rest = args[:i], args[i:]
	}
	for len(args) > 0 {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, usagef("")
			}
			return nil, usagef("%v", err)
		}
		if args = fs.Args(); len(args) > 0 {
			pos, args = append(pos, args[0]), args[1:]
		}
	}
	if n := len(pos); n < min || max >= 0 && n+len(rest) > max {
		return nil, usagef("%s: want %s", fs.Name(), argsWanted(min, max))
	}
	if c.backend == "" {
		return nil, usagef("%s: no backend: pass --backend URL or set LOCK_BACKEND", fs.Name())
	}
	return append(pos, rest...), nil
}

func argsWanted(min, max int) string {
	switch {
	case min == max:
		return fmt.Sprintf("%d argument(s)", min)
	case max < 0:
		return fmt.Sprintf("at least %d arguments", min)
	}
	return fmt.Sprintf("%d to %d arguments", min, max)
}

// fail reports err on stderr and returns its exit code.
func fail(stderr io.Writer, err error) int {
	var u *usageError
	switch {
	case errors.As(err, &u):
		if u.msg != "" {
			fmt.Fprintf(stderr, "lock: %s\n", strings.TrimSpace(u.msg))
		}
		fmt.Fprintln(stderr, "run 'lock help' for the usage")
		return exitUsage
	case errors.Is(err, errBadURL):
		fmt.Fprintf(stderr, "lock: %v\n", err)
		return exitBadURL
	}
	fmt.Fprintf(stderr, "lock: %v\n", err)
	return exitUnavailable
}
