// Command 01-cron-singleton-host is use case 1: a nightly import started by
// cron on one VM must not overlap a previous run that is still going, or
// stuck, and must start cleanly after a run that crashed.
//
// With flock (the default) the lock is the kernel's flock(2) on a file in
// the lock directory. The kernel releases it whenever the holding process
// ends, SIGKILL included, so there is no TTL to size and nothing to clean
// up. With -backend=filelock the lock is a marker file that says who holds
// it (pid, host, start time) for `cat`; a marker left by a process that
// died on this host is reclaimed at once by the next Acquire, which probes
// the pid.
//
// The demo starts a real second process of this program that takes the
// lock and hangs (the stuck previous run), runs the import (it skips),
// kills the stuck process with SIGKILL, and runs the import again (it runs).
//
//	go run ./01-cron-singleton-host                   # flock
//	go run ./01-cron-singleton-host -backend=filelock
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/examples/internal/replica"
	"github.com/ubgo/lock/filelock"
	"github.com/ubgo/lock/flock"
	"github.com/ubgo/lock/internal/testenv"
)

// NightlyImport is what cron starts: it runs the import unless a previous
// run still holds the lock, and reports whether it ran.
func NightlyImport(ctx context.Context, dir string, runImport func(ctx context.Context) error) (ran bool, err error) {
	fl := flock.New("nightly-import", flock.WithDir(dir))
	holder, err := fl.Acquire(ctx)
	if errors.Is(err, flock.ErrLocked) {
		log.Println("previous run still active; skipping")
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer holder.Release()
	return true, runImport(ctx)
}

// NightlyImportFilelock is NightlyImport on filelock: the same, plus a
// marker operators can read, renewed in the background while the import
// runs (WithLock's default), so the stale window can stay short.
func NightlyImportFilelock(ctx context.Context, dir string, runImport func(ctx context.Context) error) (ran bool, err error) {
	locks := filelock.NewFactory(filelock.WithDir(dir), filelock.WithStaleAfter(time.Minute))
	defer locks.Close()
	err = locks.WithLock(ctx, "nightly-import", runImport)
	if errors.Is(err, filelock.ErrLocked) {
		log.Println("previous run still active; skipping")
		return false, nil
	}
	return err == nil, err
}

func nightlyImport(ctx context.Context, backend, dir string, runImport func(ctx context.Context) error) (bool, error) {
	if backend == replica.Filelock {
		return NightlyImportFilelock(ctx, dir, runImport)
	}
	return NightlyImport(ctx, dir, runImport)
}

// config is one run of the demo.
type config struct {
	Backend string
	Dir     string
	// Spawn returns the command of a second process of this program that
	// plays the stuck previous run (see stuckImport).
	Spawn func() *exec.Cmd
}

// result is what happened.
type result struct {
	SkippedWhileStuck bool   // the import skipped while the stuck run held the lock
	Holder            string // who the lock said held it then (pid@host)
	StuckPID          int    // the stuck process's pid
	RanAfterKill      bool   // the import ran once the stuck run was killed
}

func run(ctx context.Context, cfg config) (res result, err error) {
	stuck := cfg.Spawn()
	stuck.Env = append(stuck.Env, envBackend+"="+cfg.Backend, envDir+"="+cfg.Dir)
	stuck.Stderr = os.Stderr
	out, err := stuck.StdoutPipe()
	if err != nil {
		return res, err
	}
	if err := stuck.Start(); err != nil {
		return res, err
	}
	defer func() {
		stuck.Process.Kill()
		stuck.Wait()
	}()
	res.StuckPID = stuck.Process.Pid
	started := make(chan error, 1)
	go func() {
		line, err := bufio.NewReader(out).ReadString('\n')
		if err == nil && !strings.HasPrefix(line, "importing") {
			err = fmt.Errorf("stuck run said %q", line)
		}
		started <- err
	}()
	select {
	case err := <-started:
		if err != nil {
			return res, fmt.Errorf("starting the stuck run: %w", err)
		}
	case <-time.After(20 * time.Second):
		return res, errors.New("the stuck run did not start within 20s")
	}
	fmt.Printf("pid %d: previous run started and hangs\n", res.StuckPID)

	res.Holder, err = holder(ctx, cfg.Backend, cfg.Dir)
	if err != nil {
		return res, err
	}
	fmt.Printf("the lock says it is held by %s\n", res.Holder)

	imported := func(ctx context.Context) error {
		fmt.Printf("pid %d: importing\n", os.Getpid())
		return nil
	}
	ran, err := nightlyImport(ctx, cfg.Backend, cfg.Dir, imported)
	if err != nil {
		return res, err
	}
	res.SkippedWhileStuck = !ran

	fmt.Printf("kill -9 %d\n", res.StuckPID)
	if err := stuck.Process.Kill(); err != nil {
		return res, err
	}
	stuck.Wait() // the process is gone: the kernel has closed its files
	res.RanAfterKill, err = nightlyImport(ctx, cfg.Backend, cfg.Dir, imported)
	return res, err
}

// holder reports who holds the import's lock, as an operator would see it.
func holder(ctx context.Context, backend, dir string) (string, error) {
	var in interface {
		lock.Inspector
		Close() error
	} = flock.NewFactory(flock.WithDir(dir))
	if backend == replica.Filelock {
		in = filelock.NewFactory(filelock.WithDir(dir))
	}
	defer in.Close()
	info, err := in.Inspect(ctx, "nightly-import")
	if err != nil || len(info.Holders) == 0 {
		return "", errors.Join(err, errors.New("nobody holds nightly-import"))
	}
	// Both report the holder's pid@host as its ID.
	return info.Holders[0].ID, nil
}

// The stuck run is this program again, told so by its environment.
const (
	childRole  = "stuck-import"
	envBackend = "EXAMPLE_BACKEND"
	envDir     = "EXAMPLE_DIR"
)

// stuckImport is the previous run that hangs: it takes the lock, says so
// on stdout, and never finishes.
func stuckImport() {
	ran, err := nightlyImport(context.Background(), os.Getenv(envBackend), os.Getenv(envDir), func(ctx context.Context) error {
		fmt.Println("importing")
		select {}
	})
	log.Fatalf("stuck run: ran %v: %v", ran, err)
}

func main() {
	if testenv.Child() == childRole {
		stuckImport()
	}
	backend := replica.Flag(replica.Flock, replica.Flock, replica.Filelock)
	flag.Parse()
	if err := demo(backend); err != nil {
		log.Fatal(err)
	}
}

func demo(backend func() (string, error)) error {
	b, err := backend()
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "example-01-")
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
	res, err := run(ctx, config{Backend: b, Dir: dir, Spawn: spawn})
	if err != nil {
		return err
	}
	fmt.Printf("skipped while the previous run hung: %v; ran after it was killed: %v\n", res.SkippedWhileStuck, res.RanAfterKill)
	return nil
}
