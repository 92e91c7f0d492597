package bench

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// spinEnv marks a re-executed copy of the benchmark binary (the command or
// the test binary) as the busy loop of the "busy" condition.
const spinEnv = "UBGO_BENCH_SPIN"

// SpinIfChild turns this process into the busy loop when the benchmark
// started it as one, and never returns then. The bench command's main and
// the test binary's TestMain call it first.
//
// This VM lets an idle CPU sleep while a client waits for a reply, and
// waking it adds tens of microseconds to every round trip. A spinning
// process at the lowest priority (SCHED_IDLE) keeps the CPUs awake without
// taking time from anything else that wants to run.
func SpinIfChild() {
	if os.Getenv(spinEnv) != "1" {
		return
	}
	runtime.GOMAXPROCS(1)
	runtime.LockOSThread()
	// SCHED_IDLE: a task that wakes up preempts the loop at once. At nice
	// 19 alone the loop measured no faster round trips here (the scheduler
	// may let it finish its slice first); nice stays as the fallback where
	// SCHED_IDLE is refused.
	_ = syscall.Setpriority(syscall.PRIO_PROCESS, 0, 19)
	_ = unix.SchedSetAttr(0, &unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: unix.SCHED_IDLE}, 0)
	//lint:ignore SA5002 spinning is this process's job
	for {
	}
}

// spinner is the busy loop child, stopped (SIGSTOP) while the "idle"
// condition is measured and running (SIGCONT) for "busy".
type spinner struct {
	cmd *exec.Cmd
	on  bool
}

func startSpinner() (*spinner, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), spinEnv+"=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("busy loop: %w", err)
	}
	s := &spinner{cmd: cmd, on: true}
	s.set(false)
	return s, nil
}

// set starts or pauses the busy loop; a nil spinner does nothing.
func (s *spinner) set(on bool) {
	if s == nil || s.on == on {
		return
	}
	sig := syscall.SIGSTOP
	if on {
		sig = syscall.SIGCONT
	}
	_ = s.cmd.Process.Signal(sig)
	s.on = on
	// Let the scheduler settle: the child has to reach (or leave) a CPU.
	time.Sleep(20 * time.Millisecond)
}

func (s *spinner) stop() {
	if s == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
}
