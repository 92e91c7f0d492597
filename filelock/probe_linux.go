package filelock

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// identity is what a marker records about the process that wrote it.
type identity struct {
	pid     int
	ticks   uint64    // start time in clock ticks after boot: with the boot id, it names the process
	start   time.Time // the same as a wall-clock time, for people reading the marker
	host    string
	bootID  string // /proc/sys/kernel/random/boot_id: which boot of which machine
	pidNS   string // the PID namespace: PIDs mean something only inside one
	timeNS  string // the time namespace: start ticks count from its boot time
	ownProc bool   // /proc is this PID namespace's, so /proc/<pid> is the process pid names here
}

var self = sync.OnceValue(func() identity {
	id := identity{pid: os.Getpid()}
	id.host, _ = os.Hostname()
	if b, err := os.ReadFile("/proc/sys/kernel/random/boot_id"); err == nil {
		id.bootID = strings.TrimSpace(string(b))
	}
	id.pidNS, _ = os.Readlink("/proc/self/ns/pid")
	id.timeNS, _ = os.Readlink("/proc/self/ns/time")
	// /proc/self is this process in any /proc, even another namespace's.
	if st, err := procStat("self"); err == nil {
		id.ticks = st.ticks
		if bt := bootTime(); !bt.IsZero() {
			id.start = bt.Add(time.Duration(st.ticks) * time.Second / time.Duration(clockTicks()))
		}
	}
	id.ownProc = ownProc(id.pid)
	return id
})

// ownProc reports whether /proc shows the PIDs of this process's namespace.
// A namespace made without mounting its own /proc (unshare --pid without
// --mount-proc) sees its parent's, where /proc/<pid> is some other process.
// NSpid lists the process's PID in every namespace from /proc's down to its
// own: one entry, ours, only when /proc is our namespace's.
func ownProc(pid int) bool {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return false
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "NSpid:"); ok {
			f := strings.Fields(v)
			return len(f) == 1 && f[0] == strconv.Itoa(pid)
		}
	}
	// Kernels before 4.1 have no NSpid: /proc/self names us by /proc's PID.
	l, err := os.Readlink("/proc/self")
	return err == nil && l == strconv.Itoa(pid)
}

// sameMachine reports whether m's PID can be probed from here: same host
// name, same boot and same PID namespace. Anything else — another host, a
// host that has rebooted, a container with its own PIDs — is left to the
// stale window.
func sameMachine(m *marker) bool {
	id := self()
	return m.Host != "" && m.Host == id.host && id.bootID != "" && m.BootID == id.bootID && m.PIDNS == id.pidNS
}

// holderGone reports whether the process that wrote m is provably dead. It
// answers false whenever it cannot be sure, leaving the marker to its stale
// window. Its proofs involve no clock: the PID is free, its process is a
// zombie, or it started at another tick since boot than the holder did (the
// PID was reused).
func holderGone(m *marker) bool {
	if m.PID <= 0 || !sameMachine(m) {
		return false
	}
	switch err := unix.Kill(m.PID, 0); err {
	case unix.ESRCH:
		return true
	case nil, unix.EPERM: // exists (EPERM: someone else's process)
	default:
		return false
	}
	if !self().ownProc {
		return false // /proc/<pid> would be another namespace's process
	}
	st, err := procStat(strconv.Itoa(m.PID))
	if errors.Is(err, fs.ErrNotExist) {
		return true // exited since kill(2) saw it
	}
	if err != nil {
		return false
	}
	if st.zombie && st.threads <= 1 {
		return true // exited, not yet reaped by its parent
	}
	// A marker without start ticks (older versions, or a holder that could
	// not read /proc) records its start only as a wall-clock time, which a
	// clock step shifts: it is left to its stale window. So is one from
	// another time namespace, whose ticks count from another boot time.
	return m.StartTicks != 0 && m.TimeNS == self().timeNS && st.ticks != m.StartTicks
}

type stat struct {
	ticks   uint64
	zombie  bool
	threads int
}

// procStat reads /proc/<pid>/stat: state (field 3), num_threads (20) and
// starttime (22, clock ticks after boot).
func procStat(pid string) (stat, error) {
	b, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return stat{}, err
	}
	// comm (field 2) is in parentheses and may contain spaces or ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return stat{}, errors.New("filelock: malformed /proc stat")
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return stat{}, errors.New("filelock: short /proc stat")
	}
	var st stat
	st.zombie = f[0] == "Z" || f[0] == "X"
	st.threads, _ = strconv.Atoi(f[17])
	st.ticks, err = strconv.ParseUint(f[19], 10, 64)
	return st, err
}

// bootTime is btime from /proc/stat (wall clock minus uptime, so it moves
// when the clock is stepped): only for the readable start time.
var bootTime = sync.OnceValue(func() time.Time {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return time.Time{}
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "btime "); ok {
			if s, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64); err == nil {
				return time.Unix(s, 0)
			}
		}
	}
	return time.Time{}
})

// clockTicks is USER_HZ, the unit of starttime, from the auxiliary vector
// (AT_CLKTCK); 100 on every mainstream Linux.
var clockTicks = sync.OnceValue(func() uint64 {
	const atClkTck = 17
	b, err := os.ReadFile("/proc/self/auxv")
	if err != nil {
		return 100
	}
	w := int(unsafe.Sizeof(uintptr(0)))
	for i := 0; i+2*w <= len(b); i += 2 * w {
		var k, v uint64
		if w == 8 {
			k, v = binary.NativeEndian.Uint64(b[i:]), binary.NativeEndian.Uint64(b[i+w:])
		} else {
			k, v = uint64(binary.NativeEndian.Uint32(b[i:])), uint64(binary.NativeEndian.Uint32(b[i+w:]))
		}
		if k == atClkTck && v > 0 {
			return v
		}
	}
	return 100
})
