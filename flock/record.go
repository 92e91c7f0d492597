package flock

import (
	"bytes"
	"errors"
	"fmt"
	"hash/crc32"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"
)

// A record is what a lock file holds, as text an operator can read with
// cat:
//
//	ubgo-flock 1 <body length> <crc32 of body, hex>
//	name "nightly/import"
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
// the permit holder's token and identity. A swept file says "dead 1". The
// checksum lets a reader that raced a writer, or met a damaged file, tell
// that the record is unusable instead of trusting half of one. A record is
// written over the old one without truncating the file: the header's
// length says where it ends. The name line is there for List, because a
// long name's file name is a hash; readers ignore lines they do not know,
// so older readers take newer records.
type record struct {
	name  string // the lock's name; empty in records written before List
	limit int
	token uint64
	dead  bool
	pid   int
	host  string
	since time.Time // written with the pid
	owner string
	meta  map[string]string
}

const recordMagic = "ubgo-flock 1 "

// maxRecord bounds what a reader accepts, so a damaged header cannot make
// it allocate without limit.
const maxRecord = 1 << 20

// encode returns the record as written to disk.
func (r *record) encode() []byte {
	var b bytes.Buffer
	if r.name != "" {
		fmt.Fprintf(&b, "name %q\n", r.name)
	}
	if r.limit > 0 {
		fmt.Fprintf(&b, "limit %d\n", r.limit)
	}
	fmt.Fprintf(&b, "token %d\n", r.token)
	if r.dead {
		b.WriteString("dead 1\n")
	}
	if r.pid != 0 {
		fmt.Fprintf(&b, "pid %d\nhost %q\nsince %s\n", r.pid, r.host, r.since.UTC().Format(time.RFC3339Nano))
	}
	if r.owner != "" {
		fmt.Fprintf(&b, "owner %q\n", r.owner)
	}
	for _, k := range slices.Sorted(maps.Keys(r.meta)) {
		fmt.Fprintf(&b, "meta %q %q\n", k, r.meta[k])
	}
	body := b.Bytes()
	return fmt.Appendf(nil, "%s%d %08x\n%s", recordMagic, len(body), crc32.ChecksumIEEE(body), body)
}

func writeRecord(fd sysFile, r *record) error {
	if err := sysPwrite(fd, r.encode(), 0); err != nil {
		return fmt.Errorf("flock: writing lock file: %w", err)
	}
	return nil
}

// readRecord reads fd's record. ok is false when the file is empty,
// damaged, or was caught half-written.
func readRecord(fd sysFile) (r record, ok bool, err error) {
	b := make([]byte, 512)
	n, err := sysPread(fd, b, 0)
	if err != nil {
		return r, false, err
	}
	head, body, found := bytes.Cut(b[:n], []byte("\n"))
	rest, magic := strings.CutPrefix(string(head), recordMagic)
	sizeText, sumText, _ := strings.Cut(rest, " ")
	size, err1 := strconv.Atoi(sizeText)
	sum, err2 := strconv.ParseUint(sumText, 16, 32)
	if !found || !magic || err1 != nil || err2 != nil || size < 0 || size > maxRecord {
		return r, false, nil
	}
	if size > len(body) {
		if n < len(b) {
			return r, false, nil // the file ends inside the record
		}
		b = make([]byte, len(head)+1+size)
		if n, err = sysPread(fd, b, 0); err != nil {
			return r, false, err
		}
		if n < len(b) {
			return r, false, nil
		}
		body = b[len(head)+1:]
	}
	body = body[:size]
	if crc32.ChecksumIEEE(body) != uint32(sum) {
		return r, false, nil
	}
	r, err = parseBody(string(body))
	return r, err == nil, nil
}

var errField = errors.New("bad field")

func parseBody(body string) (r record, err error) {
	for line := range strings.Lines(body) {
		key, val, found := strings.Cut(strings.TrimSuffix(line, "\n"), " ")
		if !found {
			return r, errField
		}
		switch key {
		case "name":
			r.name, err = strconv.Unquote(val)
		case "limit":
			r.limit, err = strconv.Atoi(val)
			if err == nil && (r.limit < 0 || r.limit > MaxPermits) {
				err = errField
			}
		case "token":
			r.token, err = strconv.ParseUint(val, 10, 64)
		case "dead":
			r.dead = val == "1"
		case "pid":
			r.pid, err = strconv.Atoi(val)
		case "host":
			r.host, err = strconv.Unquote(val)
		case "since":
			r.since, err = time.Parse(time.RFC3339Nano, val)
		case "owner":
			r.owner, err = strconv.Unquote(val)
		case "meta":
			var k, v string
			if k, v, err = parseMeta(val); err == nil {
				if r.meta == nil {
					r.meta = map[string]string{}
				}
				r.meta[k] = v
			}
		}
		if err != nil {
			return r, err
		}
	}
	return r, nil
}

// parseMeta parses a meta line's value: two quoted strings and a space.
func parseMeta(val string) (k, v string, err error) {
	q, err := strconv.QuotedPrefix(val)
	if err != nil {
		return "", "", err
	}
	rest, ok := strings.CutPrefix(val[len(q):], " ")
	if !ok {
		return "", "", errField
	}
	if k, err = strconv.Unquote(q); err == nil {
		v, err = strconv.Unquote(rest)
	}
	return k, v, err
}
