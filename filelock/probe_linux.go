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

// startTolerance is how far a process's start time, as recomputed from
// /proc, may differ from the one its marker records and still be the same
// process. Boot time in /proc/stat moves with clock adjustments and start
// times are rounded to clock ticks, so an exact comparison could call a live
// holder dead; a reused PID starts far later than 2s after the original.
const startTolerance = 2 * time.Second

// identity is what a marker records about the process that wrote it.
type identity struct {
	pid    int
	start  time.Time
	host   string
	bootID string // /proc/sys/kernel/random/boot_id: which boot of which machine
	pidNS  string // the PID namespace: PIDs mean something only inside one
}

var self = sync.OnceValue(func() identity {
	id := identity{pid: os.Getpid()}
	id.host, _ = os.Hostname()
	if b, err := os.ReadFile("/proc/sys/kernel/random/boot_id"); err == nil {
		id.bootID = strings.TrimSpace(string(b))
	}
	id.pidNS, _ = os.Readlink("/proc/self/ns/pid")
	if st, err := procStat(id.pid); err == nil {
		id.start = st.start
	}
	return id
})

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
// window.
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
	st, err := procStat(m.PID)
	if errors.Is(err, fs.ErrNotExist) {
		return true // exited since kill(2) saw it
	}
	if err != nil || st.start.IsZero() {
		return false
	}
	if st.zombie && st.threads <= 1 {
		return true // exited, not yet reaped by its parent
	}
	if m.Start.IsZero() {
		return false
	}
	d := st.start.Sub(m.Start)
	return d > startTolerance || d < -startTolerance // the PID was reused
}

type stat struct {
	start   time.Time
	zombie  bool
	threads int
}

// procStat reads /proc/<pid>/stat: state (field 3), num_threads (20) and
// starttime (22, clock ticks after boot).
func procStat(pid int) (stat, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
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
	ticks, err := strconv.ParseUint(f[19], 10, 64)
	if err != nil {
		return stat{}, err
	}
	bt, hz := bootTime(), clockTicks()
	if !bt.IsZero() {
		st.start = bt.Add(time.Duration(ticks) * time.Second / time.Duration(hz))
	}
	return st, nil
}

// bootTime is btime from /proc/stat. It is read once per process: a
// holder's start time and the probe's are then computed alike.
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
