//go:build linux

package chaos

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// The fenced register is the resource the locks protect: an integer that
// every critical section reads and increments, guarded by a fence that
// refuses any access carrying a token lower than the highest it has seen.
// A read records its token too, so a stale holder's write that comes after
// its successor's read is refused, not applied over the successor's value.
//
// In the shared workload readers' reads ('S') are fenced by the highest
// token of a writer's access only: readers of one moment have tokens in
// no order among themselves, and each is above every writer's before it.
// A writer's accesses are fenced by the highest token of any access, a
// reader's included.
//
// It is a file, shared by the client processes, whose atomicity comes from
// the kernel (flock(2) on a lock file of its own), not from the backend
// under test. Its state is the last record of an append-only log of
// fixed-size records, each written with one write(2): a client killed in
// the middle of an operation has either appended its record or not, so the
// log is the authoritative history of every access, accepted or refused.

const recLen = 128

// regOp is one record of the register's log.
type regOp struct {
	Seq     int64
	Client  int
	CS      int    // the client's critical-section number
	Kind    byte   // 'R' read, 'W' write, 'S' a reader's read (shared workload)
	Token   uint64 // the token the access carried
	Arg     int64  // value written (W)
	OK      bool   // accepted by the fence
	Value   int64  // register value after the access
	Highest uint64 // highest token after the access
	T       int64  // monotonic time of the access, under the register's lock
	// HighestW is the highest token of a writer's access after the access
	// (equal to Highest without readers).
	HighestW uint64
}

func (r regOp) encode() []byte {
	ok := 0
	if r.OK {
		ok = 1
	}
	s := fmt.Sprintf("%d %d %d %c %d %d %d %d %d %d %d", r.Seq, r.Client, r.CS, r.Kind, r.Token, r.Arg, ok, r.Value, r.Highest, r.T, r.HighestW)
	b := []byte(s + strings.Repeat(" ", recLen-1-len(s)) + "\n")
	return b
}

func parseRegOp(b []byte) (regOp, error) {
	var r regOp
	var ok int
	_, err := fmt.Sscanf(strings.TrimSpace(string(b)), "%d %d %d %c %d %d %d %d %d %d %d", &r.Seq, &r.Client, &r.CS, &r.Kind, &r.Token, &r.Arg, &ok, &r.Value, &r.Highest, &r.T, &r.HighestW)
	r.OK = ok == 1
	return r, err
}

type register struct {
	lockFd, logFd int
	client        int
}

func openRegister(dir string, client int) (*register, error) {
	l, err := unix.Open(filepath.Join(dir, "register.lock"), unix.O_RDWR|unix.O_CREAT|unix.O_CLOEXEC, 0o644)
	if err != nil {
		return nil, err
	}
	g, err := unix.Open(filepath.Join(dir, "register.log"), unix.O_RDWR|unix.O_CREAT|unix.O_APPEND|unix.O_CLOEXEC, 0o644)
	if err != nil {
		unix.Close(l)
		return nil, err
	}
	return &register{lockFd: l, logFd: g, client: client}, nil
}

func (r *register) close() {
	unix.Close(r.lockFd)
	unix.Close(r.logFd)
}

func flockRetry(fd, how int) error {
	for {
		err := unix.Flock(fd, how)
		if !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}

// access applies one fenced read ('R') or write ('W') and returns whether
// the fence accepted it and the value after it.
func (r *register) access(cs int, kind byte, token uint64, arg int64) (bool, int64, error) {
	if err := flockRetry(r.lockFd, unix.LOCK_EX); err != nil {
		return false, 0, err
	}
	defer flockRetry(r.lockFd, unix.LOCK_UN)
	var st unix.Stat_t
	if err := unix.Fstat(r.logFd, &st); err != nil {
		return false, 0, err
	}
	if st.Size%recLen != 0 {
		return false, 0, fmt.Errorf("register log torn: size %d", st.Size)
	}
	var last regOp
	if st.Size > 0 {
		b := make([]byte, recLen)
		if _, err := unix.Pread(r.logFd, b, st.Size-recLen); err != nil {
			return false, 0, err
		}
		var err error
		if last, err = parseRegOp(b); err != nil {
			return false, 0, fmt.Errorf("register log: %w", err)
		}
	}
	op := regOp{Seq: last.Seq + 1, Client: r.client, CS: cs, Kind: kind, Token: token, Arg: arg, Value: last.Value, Highest: last.Highest, HighestW: last.HighestW}
	if fenceAccepts(kind, token, last.Highest, last.HighestW) {
		op.OK, op.Highest = true, max(token, last.Highest)
		if kind != 'S' {
			op.HighestW = token
		}
		if kind == 'W' {
			op.Value = arg
		}
	}
	op.T = now()
	if _, err := unix.Write(r.logFd, op.encode()); err != nil {
		return false, 0, err
	}
	return op.OK, op.Value, nil
}

// fenceAccepts is the register's fence: a reader's read ('S') needs a
// token at least the highest of a writer's access, a writer's access one
// at least the highest of any.
func fenceAccepts(kind byte, token, highest, highestW uint64) bool {
	if kind == 'S' {
		return token > 0 && token >= highestW
	}
	return token > 0 && token >= highest
}

// readRegisterLog returns every record of the register's log, in order.
func readRegisterLog(dir string) ([]regOp, error) {
	b, err := os.ReadFile(filepath.Join(dir, "register.log"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if len(b)%recLen != 0 {
		return nil, fmt.Errorf("register log torn: size %d", len(b))
	}
	ops := make([]regOp, 0, len(b)/recLen)
	for i := 0; i < len(b); i += recLen {
		op, err := parseRegOp(b[i : i+recLen])
		if err != nil {
			return nil, fmt.Errorf("register log record %d: %w", i/recLen, err)
		}
		ops = append(ops, op)
	}
	return ops, nil
}

// now is CLOCK_MONOTONIC in nanoseconds: one clock for every process of
// the host, so the parent's fault times and the clients' histories can be
// compared.
func now() int64 {
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return ts.Nano()
}
