package flock

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
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

// encode returns the record as written to disk. It appends rather than
// formats: a record is written at every acquisition.
func (r *record) encode() []byte {
	// The body goes after room for the header, which is put in front of
	// it once its length and checksum are known.
	const room = len(recordMagic) + 20 + 1 + 8 + 1
	b := make([]byte, room, 256)
	if r.name != "" {
		b = strconv.AppendQuote(append(b, "name "...), r.name)
		b = append(b, '\n')
	}
	if r.limit > 0 {
		b = strconv.AppendInt(append(b, "limit "...), int64(r.limit), 10)
		b = append(b, '\n')
	}
	b = strconv.AppendUint(append(b, "token "...), r.token, 10)
	b = append(b, '\n')
	if r.dead {
		b = append(b, "dead 1\n"...)
	}
	if r.pid != 0 {
		b = strconv.AppendInt(append(b, "pid "...), int64(r.pid), 10)
		b = strconv.AppendQuote(append(b, "\nhost "...), r.host)
		b = r.since.UTC().AppendFormat(append(b, "\nsince "...), time.RFC3339Nano)
		b = append(b, '\n')
	}
	if r.owner != "" {
		b = strconv.AppendQuote(append(b, "owner "...), r.owner)
		b = append(b, '\n')
	}
	if len(r.meta) > 0 {
		for _, k := range slices.Sorted(maps.Keys(r.meta)) {
			b = strconv.AppendQuote(append(b, "meta "...), k)
			b = strconv.AppendQuote(append(b, ' '), r.meta[k])
			b = append(b, '\n')
		}
	}
	body := b[room:]
	var sum [4]byte
	binary.BigEndian.PutUint32(sum[:], crc32.ChecksumIEEE(body))
	var head [room]byte
	h := strconv.AppendInt(append(head[:0], recordMagic...), int64(len(body)), 10)
	h = append(hex.AppendEncode(append(h, ' '), sum[:]), '\n')
	start := room - len(h)
	copy(b[start:], h)
	return b[start:]
}

func writeRecord(fd sysFile, r *record) error {
	if err := sysPwrite(fd, r.encode(), 0); err != nil {
		return fmt.Errorf("flock: writing lock file: %w", err)
	}
	return nil
}

// readRecord reads fd's record. ok is false when the file is empty,
// damaged, or was caught half-written.
func readRecord(fd sysFile) (r record, ok bool, err error) { return read(fd, true) }

// readCounter is readRecord of the name's counter alone — limit, token,
// dead — which is all an attempt needs: the holder's lines, and their
// strings and time, are Inspect's.
func readCounter(fd sysFile) (r record, ok bool, err error) { return read(fd, false) }

func read(fd sysFile, holder bool) (r record, ok bool, err error) {
	b := make([]byte, 512)
	n, err := sysPread(fd, b, 0)
	if err != nil {
		return r, false, err
	}
	head, body, found := bytes.Cut(b[:n], []byte("\n"))
	rest, magic := bytes.CutPrefix(head, []byte(recordMagic))
	sizeText, sumText, _ := bytes.Cut(rest, []byte(" "))
	size, err1 := strconv.Atoi(string(sizeText))
	sum, err2 := strconv.ParseUint(string(sumText), 16, 32)
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
	r, err = parseBody(body, holder)
	return r, err == nil, nil
}

var errField = errors.New("bad field")

// parseBody parses a record's lines; without holder it skips the
// holder's.
func parseBody(body []byte, holder bool) (r record, err error) {
	for len(body) > 0 {
		var line []byte
		line, body, _ = bytes.Cut(body, []byte("\n"))
		key, val, found := bytes.Cut(line, []byte(" "))
		if !found {
			return r, errField
		}
		switch string(key) {
		case "limit":
			r.limit, err = strconv.Atoi(string(val))
			if err == nil && (r.limit < 0 || r.limit > MaxPermits) {
				err = errField
			}
		case "token":
			r.token, err = strconv.ParseUint(string(val), 10, 64)
		case "dead":
			r.dead = string(val) == "1"
		default:
			if holder {
				err = r.parseHolder(string(key), string(val))
			}
		}
		if err != nil {
			return r, err
		}
	}
	return r, nil
}

// parseHolder parses one of the lines that say who holds the name.
func (r *record) parseHolder(key, val string) (err error) {
	switch key {
	case "name":
		r.name, err = strconv.Unquote(val)
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
	return err
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
