package backend

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"iter"
	"os"
	"strings"

	"github.com/ubgo/lock"
)

// minCut is the shortest visible part Escape keeps of a hashed name
// (96 bytes, less a %XX escape it would split).
const minCut = 94

// EscapePrefix returns a string that begins Escape(name) for every valid
// name that begins with prefix, for a store that can only filter keys by
// their escaped form. It is the escaped prefix, cut to the part that a
// hashed name keeps, so it may also begin names that do not start with
// prefix: check the name itself as well.
func EscapePrefix(prefix string) string {
	s := escapeBytes(prefix)
	return s[:min(len(s), minCut)]
}

// escapeBytes is Escape without the hashing of long results.
func escapeBytes(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if safe(c) {
			b.WriteByte(c)
			continue
		}
		const hexd = "0123456789ABCDEF"
		b.WriteByte('%')
		b.WriteByte(hexd[c>>4])
		b.WriteByte(hexd[c&15])
	}
	return b.String()
}

// unescape returns the name esc was made from by Escape. ok is false when
// esc is no result of Escape, or a hashed one (a long name), which cannot
// be turned back: a backend that must list such names stores them.
func unescape(esc string) (name string, ok bool) {
	if strings.IndexByte(esc, '~') >= 0 {
		return "", false
	}
	var b strings.Builder
	for i := 0; i < len(esc); i++ {
		c := esc[i]
		if c != '%' {
			if !safe(c) {
				return "", false
			}
			b.WriteByte(c)
			continue
		}
		if i+2 >= len(esc) {
			return "", false
		}
		hi, lo := unhex(esc[i+1]), unhex(esc[i+2])
		if hi < 0 || lo < 0 || safe(byte(hi<<4|lo)) {
			return "", false // Escape never encodes a safe byte
		}
		b.WriteByte(byte(hi<<4 | lo))
		i += 2
	}
	name = b.String()
	if lock.ValidateName(name) != nil || Escape(name) != esc {
		return "", false
	}
	return name, true
}

func unhex(c byte) int {
	switch {
	case '0' <= c && c <= '9':
		return int(c - '0')
	case 'A' <= c && c <= 'F':
		return int(c-'A') + 10
	}
	return -1
}

// ListedName is the name a Lister reports for the escaped form esc when
// the store kept no name of its own: the name itself, or, for a hashed
// long name, esc. match reports whether it belongs under prefix; a hashed
// name matches when its visible part begins with the whole escaped prefix
// (so one under a prefix longer than that part is not listed).
// Anything else under a store's prefix (etcdlock's fence and ledger
// records, <prefix>.fence/ and <prefix>.done/) is no name: match is false.
func ListedName(esc, prefix string) (name string, match bool) {
	if n, ok := unescape(esc); ok {
		return n, strings.HasPrefix(n, prefix)
	}
	visible, sum, ok := strings.Cut(esc, "~")
	if !ok || len(sum) != 2*sha256.Size || strings.Trim(sum, "0123456789abcdef") != "" || strings.TrimFunc(visible, escapedRune) != "" {
		return "", false
	}
	return esc, strings.HasPrefix(visible, escapeBytes(prefix))
}

// escapedRune reports whether r may appear in Escape's output before '~'.
func escapedRune(r rune) bool { return r < 0x80 && (safe(byte(r)) || r == '%') }

// ListDir is the List of a backend that keeps each name's state in files
// of one directory (flock, filelock). It reads the directory (from dir,
// called when the iteration starts) lock.ListPageSize entries at a time,
// keeps the files that esc maps to an escaped name beginning with prefix's
// escaped form, and yields what inspect reports of each name that is held
// and begins with prefix; a name inspect cannot tell (unreadable records)
// is listed as ListedName says. The order is the directory's. Errors read
// "<who>: …".
func ListDir(ctx context.Context, who, prefix string, dir func() (string, error), esc func(file string) (string, bool), inspect func(dir, esc string) (lock.Info, error)) iter.Seq2[lock.Info, error] {
	return func(yield func(lock.Info, error) bool) {
		path, err := dir()
		if err != nil {
			yield(lock.Info{}, err)
			return
		}
		d, err := os.Open(path)
		if errors.Is(err, fs.ErrNotExist) {
			return // nothing was ever held here
		}
		if err != nil {
			yield(lock.Info{}, fmt.Errorf("%s: %w", who, err))
			return
		}
		defer d.Close()
		ep := EscapePrefix(prefix)
		for {
			entries, rerr := d.ReadDir(lock.ListPageSize)
			for _, e := range entries {
				name, ok := esc(e.Name())
				if !ok || !strings.HasPrefix(name, ep) {
					continue
				}
				if err := ctx.Err(); err != nil {
					yield(lock.Info{}, err)
					return
				}
				info, err := inspect(path, name)
				if err != nil {
					yield(lock.Info{}, err)
					return
				}
				match := strings.HasPrefix(info.Name, prefix)
				if info.Name == "" {
					info.Name, match = ListedName(name, prefix)
				}
				if len(info.Holders) == 0 || !match {
					continue
				}
				if !yield(info, nil) {
					return
				}
			}
			if rerr == io.EOF {
				return
			}
			if rerr != nil {
				yield(lock.Info{}, fmt.Errorf("%s: %w", who, rerr))
				return
			}
		}
	}
}
