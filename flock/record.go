package flock

import (
	"bytes"
	"hash/crc32"
	"maps"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// A record is what a lock file holds, as text an operator can read with
// cat:
//
//	ubgo-flock 1 <body length> <crc32 of body, hex>
//	limit 1
//	token 1764480000000000001
//	pid 4242
//	host "web-1"
//	since 2026-11-30T04:56:37.331225487Z
//	owner "nightly-import"
//	meta "k" "v"
//
// The name file <esc>.lock holds the limit and the token counter of the
// name (and, for a mutex, who holds it); a slot file <esc>.<i>.lock holds
// the permit holder's token and identity. A pruned file says "dead 1". The
// checksum lets a reader that raced a writer, or met a damaged file, tell
// that the record is unusable instead of trusting half of one.
type record struct {
	limit int
	token uint64
	dead  bool
	pid   int
	host  string
	since int64 // unix nanoseconds; written as RFC 3339 UTC
	owner string
	meta  map[string]string
}

const recordMagic = "ubgo-flock 1 "

// maxRecord bounds what a reader accepts, so a damaged header cannot make
// it allocate without limit.
const maxRecord = 1 << 20

func (r *record) appendBody(b []byte) []byte {
	if r.limit > 0 {
		b = append(b, "limit "...)
		b = strconv.AppendInt(b, int64(r.limit), 10)
		b = append(b, '\n')
	}
	b = append(b, "token "...)
	b = strconv.AppendUint(b, r.token, 10)
	b = append(b, '\n')
	if r.dead {
		b = append(b, "dead 1\n"...)
	}
	if r.pid != 0 {
		if r.pid == pid && r.host == hostname() {
			b = append(b, selfLines()...)
		} else {
			b = appendPidHost(b, r.pid, r.host)
		}
		b = append(b, "since "...)
		b = appendSince(b, r.since)
		b = append(b, '\n')
	}
	if r.owner != "" {
		b = append(b, "owner "...)
		b = strconv.AppendQuote(b, r.owner)
		b = append(b, '\n')
	}
	if len(r.meta) == 0 {
		return b
	}
	for _, k := range slices.Sorted(maps.Keys(r.meta)) {
		b = append(b, "meta "...)
		b = strconv.AppendQuote(b, k)
		b = append(b, ' ')
		b = strconv.AppendQuote(b, r.meta[k])
		b = append(b, '\n')
	}
	return b
}

func appendPidHost(b []byte, pid int, host string) []byte {
	b = append(b, "pid "...)
	b = strconv.AppendInt(b, int64(pid), 10)
	b = append(b, "\nhost "...)
	b = strconv.AppendQuote(b, host)
	return append(b, '\n')
}

// selfLines are the pid and host lines of this process's records.
var selfLines = sync.OnceValue(func() []byte { return appendPidHost(nil, pid, hostname()) })

// sinceSecond caches the date and time of one second as RFC 3339 UTC:
// records written in the same second share it, and formatting a date is
// most of the cost of encoding a record.
type sinceSecond struct {
	sec  int64
	text string // 2006-01-02T15:04:05
}

var lastSecond atomic.Pointer[sinceSecond]

// appendSince appends ns (unix nanoseconds) as time.RFC3339Nano in UTC
// would.
func appendSince(b []byte, ns int64) []byte {
	if ns < 0 {
		return time.Unix(0, ns).UTC().AppendFormat(b, time.RFC3339Nano)
	}
	sec, frac := ns/1e9, ns%1e9
	c := lastSecond.Load()
	if c == nil || c.sec != sec {
		c = &sinceSecond{sec: sec, text: time.Unix(sec, 0).UTC().Format("2006-01-02T15:04:05")}
		lastSecond.Store(c)
	}
	b = append(b, c.text...)
	if frac != 0 {
		var d [10]byte
		d[0] = '.'
		for i := 9; i >= 1; i-- {
			d[i] = byte('0' + frac%10)
			frac /= 10
		}
		n := 10
		for d[n-1] == '0' {
			n--
		}
		b = append(b, d[:n]...)
	}
	return append(b, 'Z')
}

// maxHead bounds a record's header line: the magic, the body's length
// (at most 20 digits), a space, the checksum (8) and a newline.
const maxHead = len(recordMagic) + 20 + 1 + 8 + 1

// encode appends the record as written to disk to dst.
func (r *record) encode(dst []byte) []byte {
	// The body goes first, after room for the header, which needs the
	// body's length and checksum; the header then goes right before it.
	start := len(dst)
	dst = append(dst, make([]byte, maxHead)...)
	dst = r.appendBody(dst)
	body := dst[start+maxHead:]
	var hb [maxHead]byte
	head := append(hb[:0], recordMagic...)
	head = strconv.AppendInt(head, int64(len(body)), 10)
	head = append(head, ' ')
	head = appendHex32(head, crc32.ChecksumIEEE(body))
	head = append(head, '\n')
	at := start + maxHead - len(head)
	copy(dst[at:], head)
	n := copy(dst[start:], dst[at:])
	return dst[:start+n]
}

func appendHex32(b []byte, v uint32) []byte {
	const hexd = "0123456789abcdef"
	for s := 28; s >= 0; s -= 4 {
		b = append(b, hexd[(v>>uint(s))&15])
	}
	return b
}

var bufs = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

// readRecord reads the limit, token and dead mark of f's record. ok is
// false when the file is empty, damaged, or was caught half-written.
func readRecord(f sysFile) (r record, ok bool, err error) { return readRecordOf(f, false) }

// readHolder reads the whole record, holder identity included.
func readHolder(f sysFile) (r record, ok bool, err error) { return readRecordOf(f, true) }

func readRecordOf(f sysFile, full bool) (r record, ok bool, err error) {
	bp := bufs.Get().(*[]byte)
	defer bufs.Put(bp)
	b := (*bp)[:cap(*bp)]
	n, err := sysPread(f, b, 0)
	if err != nil {
		return r, false, err
	}
	b = b[:n]
	nl := bytes.IndexByte(b, '\n')
	if nl < 0 || !bytes.HasPrefix(b, []byte(recordMagic)) {
		return r, false, nil
	}
	head := b[len(recordMagic):nl]
	sp := bytes.IndexByte(head, ' ')
	if sp < 0 {
		return r, false, nil
	}
	size, ok1 := atou(head[:sp], 10)
	sum, ok2 := atou(head[sp+1:], 16)
	if !ok1 || !ok2 || size > maxRecord || sum > 1<<32-1 {
		return r, false, nil
	}
	if end := nl + 1 + int(size); end > len(b) {
		if len(b) < cap(b) {
			return r, false, nil // the file ends inside the record
		}
		big := make([]byte, end)
		if n, err = sysPread(f, big, 0); err != nil {
			return r, false, err
		}
		if b = big[:n]; end > len(b) {
			return r, false, nil
		}
	}
	body := b[nl+1 : nl+1+int(size)]
	if crc32.ChecksumIEEE(body) != uint32(sum) {
		return r, false, nil
	}
	return parseBody(body, full)
}

// atou parses an unsigned number without allocating.
func atou(b []byte, base uint64) (uint64, bool) {
	if len(b) == 0 || len(b) > 20 {
		return 0, false
	}
	const maxU = 1<<64 - 1
	cutoff := uint64(maxU / 10) // v*base overflows above it; no division per digit
	if base == 16 {
		cutoff = maxU / 16
	}
	var v uint64
	for _, c := range b {
		var d uint64
		switch {
		case '0' <= c && c <= '9':
			d = uint64(c - '0')
		case base == 16 && 'a' <= c && c <= 'f':
			d = uint64(c-'a') + 10
		default:
			return 0, false
		}
		if v > cutoff || v*base > maxU-d {
			return 0, false // overflow
		}
		v = v*base + d
	}
	return v, true
}

func parseBody(body []byte, full bool) (r record, ok bool, err error) {
	for len(body) > 0 {
		nl := bytes.IndexByte(body, '\n')
		if nl < 0 {
			return r, false, nil
		}
		lb := body[:nl]
		body = body[nl+1:]
		sp := bytes.IndexByte(lb, ' ')
		if sp < 0 {
			return r, false, nil
		}
		vb := lb[sp+1:]
		switch string(lb[:sp]) {
		case "limit":
			v, ok := atou(vb, 10)
			if !ok || v > MaxPermits {
				return r, false, nil
			}
			r.limit = int(v)
		case "token":
			if r.token, ok = atou(vb, 10); !ok {
				return r, false, nil
			}
		case "dead":
			r.dead = string(vb) == "1"
		default:
			if full && !parseHolderField(&r, string(lb[:sp]), string(vb)) {
				return r, false, nil
			}
		}
	}
	return r, true, nil
}

func parseHolderField(r *record, key, val string) bool {
	var perr error
	switch key {
	case "pid":
		r.pid, perr = strconv.Atoi(val)
	case "host":
		r.host, perr = strconv.Unquote(val)
	case "since":
		var t time.Time
		t, perr = time.Parse(time.RFC3339Nano, val)
		r.since = t.UnixNano()
	case "owner":
		r.owner, perr = strconv.Unquote(val)
	case "meta":
		k, rest, perr2 := unquotePrefix(val)
		if perr2 != nil || len(rest) < 2 || rest[0] != ' ' {
			return false
		}
		v, perr3 := strconv.Unquote(rest[1:])
		if perr3 != nil {
			return false
		}
		if r.meta == nil {
			r.meta = map[string]string{}
		}
		r.meta[k] = v
	}
	return perr == nil
}

// unquotePrefix unquotes the Go string literal at the start of s and
// returns the rest.
func unquotePrefix(s string) (string, string, error) {
	q, err := strconv.QuotedPrefix(s)
	if err != nil {
		return "", "", err
	}
	v, err := strconv.Unquote(q)
	return v, s[len(q):], err
}
