//go:build unix

package filelock

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/ubgo/lock/backend"
)

// File names in the lock directory. esc is backend.Escape(name), which has
// no '.', so the suffixes below keep every name's files apart.
func mutexPath(dir, esc string) string { return dir + "/" + esc + ".lock" }
func slotPath(dir, esc string, i int) string {
	return dir + "/" + esc + "." + strconv.Itoa(i) + ".lock"
}
func counterPath(dir, esc string) string { return dir + "/" + esc + ".token" }

// wantPath is the intent marker of a writer that waits for a name held
// shared or exclusively (WithWait): while it is live, new shared
// acquirers stay out.
func wantPath(dir, esc string) string        { return dir + "/" + esc + ".want" }
func tempPath(dir, esc, nonce string) string { return dir + "/" + esc + "." + nonce + ".tmp" }
func markerPaths(dir, esc string, limit int) []string {
	if limit <= 1 {
		return []string{mutexPath(dir, esc)}
	}
	return slotPaths(dir, esc, limit)
}

// slotPaths are the slot markers 0 … n-1 of esc: a semaphore's permits,
// or the markers of a name's shared holders (one per reader).
func slotPaths(dir, esc string, n int) []string {
	ps := make([]string, n)
	for i := range ps {
		ps[i] = slotPath(dir, esc, i)
	}
	return ps
}

// heldPaths are the markers that may hold esc by its counter c: its
// limit's, and for a limit of 1 also the reader slots it records.
func heldPaths(dir, esc string, c counter) []string {
	ps := markerPaths(dir, esc, c.limit)
	if c.limit == 1 {
		ps = append(ps, slotPaths(dir, esc, c.readers)...)
	}
	return ps
}

// slotOf returns the slot number of a slot marker's path, or -1.
func slotOf(path string) int {
	_, rest, _ := strings.Cut(path[strings.LastIndexByte(path, '/')+1:], ".")
	i, err := strconv.Atoi(strings.TrimSuffix(rest, ".lock"))
	if err != nil || !strings.HasSuffix(rest, ".lock") {
		return -1
	}
	return i
}

// fileKind classifies a directory entry; esc is the escaped name it belongs
// to.
type fileKind int

const (
	kindOther fileKind = iota
	kindMarker
	kindCounter
	kindTemp
	kindWant
)

func classify(file string) (esc string, kind fileKind) {
	esc, rest, ok := strings.Cut(file, ".")
	if !ok || esc == "" {
		return "", kindOther
	}
	switch {
	case rest == "lock":
		return esc, kindMarker
	case rest == "token":
		return esc, kindCounter
	case rest == "want":
		return esc, kindWant
	case strings.HasSuffix(rest, ".tmp"):
		return esc, kindTemp
	case strings.HasSuffix(rest, ".lock"):
		n := strings.TrimSuffix(rest, ".lock")
		if _, err := strconv.Atoi(n); err == nil && n != "" && strings.Trim(n, "0123456789") == "" {
			return esc, kindMarker
		}
	}
	return "", kindOther
}

func newNonce() string {
	var b [16]byte
	rand.Read(b[:]) // never fails (crypto/rand panics rather than return short)
	return hex.EncodeToString(b[:])
}

// marker is the content of one marker file: who holds the lock and until
// when. It is written whole (temp file, fsync, link or rename), so a reader
// never sees half of one.
type marker struct {
	Name       string
	Token      uint64
	Nonce      string // unique per acquisition: what makes a marker ours
	PID        int
	Start      time.Time // start time of the holder process, for people
	StartTicks uint64    // the same in clock ticks after boot, for the probe
	Host       string
	BootID     string
	PIDNS      string
	TimeNS     string
	Acquired   time.Time
	Refreshed  time.Time
	Expires    time.Time
	StaleAfter time.Duration
	Limit      int
	Slot       int
	Shared     bool // a shared holder's (WithShared), in a reader slot
	Owner      string
	Meta       map[string]string
}

const markerHeader = "# github.com/ubgo/lock/filelock marker: one key=value per line\n"

func (m *marker) encode() []byte {
	var b bytes.Buffer
	b.WriteString(markerHeader)
	kv := func(k, v string) {
		b.WriteString(k)
		b.WriteByte('=')
		b.WriteString(quote(v, false))
		b.WriteByte('\n')
	}
	ts := func(t time.Time) string {
		if t.IsZero() {
			return ""
		}
		return t.UTC().Format(time.RFC3339Nano)
	}
	kv("name", m.Name)
	kv("token", strconv.FormatUint(m.Token, 10))
	kv("nonce", m.Nonce)
	kv("pid", strconv.Itoa(m.PID))
	kv("start", ts(m.Start))
	if m.StartTicks != 0 {
		kv("start_ticks", strconv.FormatUint(m.StartTicks, 10))
	}
	kv("host", m.Host)
	kv("boot_id", m.BootID)
	kv("pid_ns", m.PIDNS)
	if m.TimeNS != "" {
		kv("time_ns", m.TimeNS)
	}
	kv("acquired", ts(m.Acquired))
	kv("refreshed", ts(m.Refreshed))
	kv("expires", ts(m.Expires))
	kv("stale_after", m.StaleAfter.String())
	kv("limit", strconv.Itoa(m.Limit))
	kv("slot", strconv.Itoa(m.Slot))
	if m.Shared {
		kv("shared", "true")
	}
	if m.Owner != "" {
		kv("owner", m.Owner)
	}
	for _, k := range slices.Sorted(maps.Keys(m.Meta)) {
		kv("meta."+quote(k, true), m.Meta[k])
	}
	return b.Bytes()
}

// quote leaves plain text as it is, so `cat` shows it, and writes anything
// that could break the line format as a Go string literal.
func quote(s string, key bool) string {
	plain := utf8.ValidString(s) && !strings.HasPrefix(s, `"`) && strings.TrimSpace(s) == s
	for _, r := range s {
		if !unicode.IsPrint(r) || key && r == '=' {
			plain = false
			break
		}
	}
	if plain {
		return s
	}
	return strconv.Quote(s)
}

func unquote(s string) (string, error) {
	if strings.HasPrefix(s, `"`) {
		return strconv.Unquote(s)
	}
	return s, nil
}

var errCorrupt = errors.New("filelock: unreadable marker")

func parseMarker(data []byte) (*marker, error) {
	m := &marker{}
	var err error
	for line := range strings.Lines(string(data)) {
		line = strings.TrimSuffix(line, "\n")
		if line == "" || line[0] == '#' {
			continue
		}
		var key string
		if rest, ok := strings.CutPrefix(line, "meta."); ok {
			k := rest
			if strings.HasPrefix(rest, `"`) {
				q, qerr := strconv.QuotedPrefix(rest)
				if qerr != nil {
					return nil, errCorrupt
				}
				k = q
			} else if i := strings.IndexByte(rest, '='); i >= 0 {
				k = rest[:i]
			}
			v, ok := strings.CutPrefix(rest[len(k):], "=")
			if !ok {
				return nil, errCorrupt
			}
			if k, err = unquote(k); err != nil {
				return nil, errCorrupt
			}
			if v, err = unquote(v); err != nil {
				return nil, errCorrupt
			}
			if m.Meta == nil {
				m.Meta = map[string]string{}
			}
			m.Meta[k] = v
			continue
		}
		key, v, ok := strings.Cut(line, "=")
		if !ok {
			return nil, errCorrupt
		}
		if v, err = unquote(v); err != nil {
			return nil, errCorrupt
		}
		if err := m.set(key, v); err != nil {
			return nil, errCorrupt
		}
	}
	if m.Nonce == "" || m.Expires.IsZero() {
		return nil, errCorrupt
	}
	return m, nil
}

func (m *marker) set(key, v string) error {
	var err error
	tm := func() (time.Time, error) {
		if v == "" {
			return time.Time{}, nil
		}
		return time.Parse(time.RFC3339Nano, v)
	}
	switch key {
	case "name":
		m.Name = v
	case "token":
		m.Token, err = strconv.ParseUint(v, 10, 64)
	case "nonce":
		m.Nonce = v
	case "pid":
		var p int64
		p, err = strconv.ParseInt(v, 10, 32)
		m.PID = int(p)
	case "start":
		m.Start, err = tm()
	case "start_ticks":
		if v != "" {
			m.StartTicks, err = strconv.ParseUint(v, 10, 64)
		}
	case "host":
		m.Host = v
	case "boot_id":
		m.BootID = v
	case "pid_ns":
		m.PIDNS = v
	case "time_ns":
		m.TimeNS = v
	case "acquired":
		m.Acquired, err = tm()
	case "refreshed":
		m.Refreshed, err = tm()
	case "expires":
		m.Expires, err = tm()
	case "stale_after":
		m.StaleAfter, err = time.ParseDuration(v)
	case "limit":
		m.Limit, err = strconv.Atoi(v)
	case "slot":
		m.Slot, err = strconv.Atoi(v)
	case "shared":
		m.Shared, err = strconv.ParseBool(v)
	case "owner":
		m.Owner = v
	}
	return err
}

// readMarker reads the marker at path. err matches unix.ENOENT when
// there is none; m is nil with a nil err when the file exists but cannot be
// parsed, in which case mtime still tells its age.
func readMarker(path string) (m *marker, mtime time.Time, err error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, time.Time{}, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, time.Time{}, err
	}
	mtime = st.ModTime()
	data, err := io.ReadAll(io.LimitReader(f, maxMarker+1))
	if err != nil {
		return nil, mtime, err
	}
	if len(data) > maxMarker {
		return nil, mtime, nil // not one of ours: judged like any unreadable marker
	}
	m, perr := parseMarker(data)
	if perr != nil {
		return nil, mtime, nil
	}
	return m, mtime, nil
}

// maxMarker is the size of the largest marker written or read.
const maxMarker = 1 << 20

// open opens path, retrying when a signal interrupts it, for the callers
// that need a descriptor (flock, pread).
func open(path string, flags int, perm uint32) (int, error) {
	for {
		fd, err := unix.Open(path, flags|unix.O_CLOEXEC, perm)
		if err != unix.EINTR {
			return fd, err
		}
	}
}

// syncFile syncs the file being written at path; tests wrap it to stall or
// fail the disk.
var syncFile = func(path string, f *os.File) error { return f.Sync() }

// createTemp writes data to a new temporary file and returns it open, not
// synced. The data is whole before the link or rename that follows makes
// it visible; a sync, where one is needed, makes it durable.
func createTemp(path string, data []byte) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return nil, err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		os.Remove(path)
		return nil, err
	}
	return f, nil
}

// writeTemp is createTemp, synced and closed.
func writeTemp(path string, data []byte) error {
	f, err := createTemp(path, data)
	if err != nil {
		return err
	}
	err = syncFile(path, f)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(path)
	}
	return err
}

// counter is the content of <name>.token: the last fencing token handed out
// for the name, the semaphore limit its holders use, and for a name taken
// shared how many reader slots may be in use. The file is also
// the name's guard: it is flocked for the few syscalls of every change to
// the name's markers.
type counter struct {
	token uint64
	valid bool // false: missing or corrupt, the clock floor alone applies
	limit int  // 0: unknown
	// readers: the reader slots 0 … readers-1 may hold markers. A reader
	// that raises it syncs the counter, as its marker, before its Acquire
	// returns, so no crash can leave a live reader beyond it; a writer
	// that found every slot free lowers it to 0.
	readers int
}

func readCounter(fd int) counter {
	buf := make([]byte, 128)
	n, err := unix.Pread(fd, buf, 0)
	if err != nil || n == 0 || n == len(buf) {
		return counter{}
	}
	body, sum, ok := strings.Cut(string(buf[:n]), "crc=")
	if !ok || strings.TrimSpace(sum) != fmt.Sprintf("%08x", crc32.ChecksumIEEE([]byte(body))) {
		return counter{}
	}
	var c counter
	for line := range strings.Lines(body) {
		k, v, _ := strings.Cut(strings.TrimSpace(line), "=")
		switch k {
		case "token":
			t, err := strconv.ParseUint(v, 10, 64)
			if err != nil || t == 0 {
				return counter{}
			}
			c.token, c.valid = t, true
		case "limit":
			c.limit, _ = strconv.Atoi(v)
		case "readers":
			c.readers, _ = strconv.Atoi(v)
		}
	}
	return c
}

// putCounter replaces the counter in place, without flushing it to disk:
// an acquire's token does not depend on the counter surviving a host crash
// (see nextToken). A write torn by a crash fails the checksum.
func putCounter(fd int, token uint64, limit, readers int) error {
	body := fmt.Sprintf("token=%d\nlimit=%d\n", token, limit)
	if readers > 0 {
		body += fmt.Sprintf("readers=%d\n", readers)
	}
	data := fmt.Sprintf("%scrc=%08x\n", body, crc32.ChecksumIEEE([]byte(body)))
	if _, err := unix.Pwrite(fd, []byte(data), 0); err != nil {
		return err
	}
	return unix.Ftruncate(fd, int64(len(data)))
}

// writeCounter is putCounter and a sync, for a Fence record (a fence that
// forgot its highest token after a crash would let a stale writer in) and
// for a reader that raised the reader count (a counter that forgot it
// would hide the reader from writers).
func writeCounter(fd int, token uint64, limit, readers int) error {
	if err := putCounter(fd, token, limit, readers); err != nil {
		return err
	}
	return datasync(fd)
}

// syncCounter flushes the counter of esc to disk.
func syncCounter(dir, esc string) error {
	fd, err := open(counterPath(dir, esc), unix.O_RDONLY, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return datasync(fd)
}

// nextToken is the token of an acquire: backend.NextToken over the highest
// token known, the counter's if it is sound and the highest seen in the
// name's markers. Its clock floor, not a flush of the counter, is what
// keeps tokens above every earlier one after a host crash that reverted,
// truncated or tore the counter.
func nextToken(c counter, seen uint64) uint64 {
	stored := seen
	if c.valid {
		stored = max(stored, c.token)
	}
	return backend.NextToken(stored, time.Now())
}

// namePaths lists the marker files that exist for esc.
func namePaths(dir, esc string) ([]string, error) {
	fd, err := open(counterPath(dir, esc), unix.O_RDONLY, 0)
	if err == nil {
		c := readCounter(fd)
		unix.Close(fd)
		if c.limit > 0 {
			return heldPaths(dir, esc, c), nil
		}
	}
	return markerFiles(dir, esc) // no counter to say the limit
}

// markerFiles lists the marker files of esc in dir, whatever their layout.
func markerFiles(dir, esc string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("filelock: %w", err)
	}
	var ps []string
	for _, e := range entries {
		if n, kind := classify(e.Name()); n == esc && kind == kindMarker {
			ps = append(ps, filepath.Join(dir, e.Name()))
		}
	}
	return ps, nil
}
