//go:build linux

package chaos

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/backend"
	"github.com/ubgo/lock/filelock"
	"github.com/ubgo/lock/flock"
	"github.com/ubgo/lock/pglock"
	"github.com/ubgo/lock/redislock"
)

// Names that have broken name mappings elsewhere: shadowing (a vs a/b),
// slots and counters (x.0 vs slot 0 of x, x:fence vs x's counter), escapes
// (../../etc/passwd), the escape character itself, hash tags, and names
// long enough to be hashed.
var nameSeeds = [][2]string{
	{"a", "a/b"}, {"a/b", "a%2Fb"}, {"x", "x.0"}, {"x.0", "x"}, {"x", "x:fence"}, {"x", "x:token"},
	{"x", "x.token"}, {"x", "x.guard"}, {"x", "x.lock"}, {"x", "x/1/y"},
	{"../../etc/passwd", "etc/passwd"}, {"/", "//"}, {".", ".."}, {"%", "%25"}, {"~", "%7E"},
	{"{a}", "a"}, {"a}:lock", "a"}, {"ubgo-flock.fence", "x"},
	{"ü", "Ã¼"}, {"a b", "a+b"}, {"a\nb", "a b"},
	{strings.Repeat("é", 100), strings.Repeat("é", 99) + "e"},
	{strings.Repeat("a", 200), strings.Repeat("a", 199) + "b"},
	{strings.Repeat("a", 4096), strings.Repeat("a", 4095)},
	{"", "x"}, {"a\x00b", "a"}, {"\xff", "x"}, {strings.Repeat("a", 4097), "a"},
}

func addNameSeeds(f *testing.F) {
	for i, s := range nameSeeds {
		f.Add(s[0], s[1], uint8(i%4))
	}
}

func FuzzNamesFlock(f *testing.F)     { fuzzNames(f, "flock") }
func FuzzNamesFilelock(f *testing.F)  { fuzzNames(f, "filelock") }
func FuzzNamesPglock(f *testing.F)    { fuzzNames(f, "pglock") }
func FuzzNamesRedislock(f *testing.F) { fuzzNames(f, "redislock") }
func FuzzNamesEtcdlock(f *testing.F)  { fuzzNames(f, "etcdlock") }

var fuzzSeq atomic.Int64

// fuzzNames checks a backend's mapping of two names to storage: an invalid
// name is refused with ErrInvalidName and writes nothing; a valid one writes
// only inside its directory or under its prefix; and two distinct names —
// one a semaphore with all its permits taken, the other a mutex — never
// share a file, key or slot (each can be held while the other is).
func fuzzNames(f *testing.F, b string) {
	addNameSeeds(f)
	f.Fuzz(func(t *testing.T, a, c string, n uint8) {
		limit := int(n%4) + 1
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		st := newStore(t, b)
		defer st.cleanup()
		fac := newFactory(t, b, st.opts...)
		defer fac.close()

		var held []lock.Holder
		defer func() {
			for _, h := range held {
				h.Release()
			}
		}()
		take := func(name string, opts ...lock.Option) (lock.Holder, error) {
			h, err := fac.acquire(ctx, name, opts...)
			if err == nil {
				held = append(held, h)
			}
			return h, err
		}
		for _, name := range []string{a, c} {
			if lock.ValidateName(name) != nil {
				if _, err := take(name); !errors.Is(err, lock.ErrInvalidName) {
					t.Fatalf("Acquire(%q) = %v; want ErrInvalidName", name, err)
				}
			}
		}
		if st.check != nil {
			st.check(t, nil) // nothing written for invalid names
		}
		if lock.ValidateName(a) != nil || lock.ValidateName(c) != nil || a == c {
			return
		}
		for i := 0; i < limit; i++ {
			if _, err := take(a, lock.WithMaxConcurrent(limit)); err != nil {
				t.Fatalf("permit %d of %q (limit %d): %v", i, a, limit, err)
			}
		}
		if _, err := take(a, lock.WithMaxConcurrent(limit)); !errors.Is(err, lock.ErrLocked) {
			t.Fatalf("permit %d of %q (limit %d) = %v; want ErrLocked", limit, a, limit, err)
		}
		if _, err := take(c); err != nil {
			t.Fatalf("%q is not free while %q is held (limit %d): %v", c, a, limit, err)
		}
		if st.check != nil {
			st.check(t, map[string]int{a: limit, c: 1})
		}
	})
}

// store is where a fuzz case's backend writes, and how to check it.
type store struct {
	opts    []lock.Option
	check   func(t *testing.T, held map[string]int)
	cleanup func()
}

func newStore(t *testing.T, b string) *store {
	seq := fuzzSeq.Add(1)
	switch b {
	case "flock", "filelock":
		root := t.TempDir()
		dir := filepath.Join(root, "locks")
		return &store{
			opts:    []lock.Option{lock.WithDir(dir)},
			cleanup: func() {},
			check: func(t *testing.T, held map[string]int) {
				filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
					if err != nil || path == root || path == dir {
						return nil
					}
					if filepath.Dir(path) != dir {
						t.Errorf("%s wrote %s, outside its directory %s", b, path, dir)
					}
					return nil
				})
			},
		}
	case "redislock":
		prefix := fmt.Sprintf("chaos-fuzz-%d-%d:", time.Now().UnixNano(), seq)
		rdb := sharedRedis(t)
		keys := func() []string {
			var ks []string
			iter := rdb.Scan(context.Background(), 0, prefix+"*", 1000).Iterator()
			for iter.Next(context.Background()) {
				ks = append(ks, iter.Val())
			}
			return ks
		}
		return &store{
			opts: []lock.Option{lock.WithKeyPrefix(prefix)},
			cleanup: func() {
				if ks := keys(); len(ks) > 0 {
					rdb.Del(context.Background(), ks...)
				}
			},
			check: func(t *testing.T, held map[string]int) {
				checkRedisKeys(t, rdb, prefix, keys(), held)
			},
		}
	case "etcdlock":
		prefix := fmt.Sprintf("chaos-fuzz/%d-%d/", time.Now().UnixNano(), seq)
		cli := sharedEtcd(t)
		return &store{
			opts:    []lock.Option{lock.WithKeyPrefix(prefix)},
			cleanup: func() { cli.Delete(context.Background(), prefix, clientv3.WithPrefix()) },
			check: func(t *testing.T, held map[string]int) {
				resp, err := cli.Get(context.Background(), prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
				if err != nil {
					t.Fatal(err)
				}
				var ks []string
				for _, kv := range resp.Kvs {
					ks = append(ks, string(kv.Key))
				}
				checkEtcdKeys(t, prefix, ks, held)
			},
		}
	case "pglock":
		return &store{opts: []lock.Option{lock.WithKeyPrefix(fmt.Sprintf("chaos-fuzz-%d-%d", time.Now().UnixNano(), seq))}, cleanup: func() {}}
	}
	return &store{cleanup: func() {}}
}

// checkRedisKeys: every key under prefix is one of the documented keys of
// a held name, and each held name has its keys.
func checkRedisKeys(t *testing.T, rdb *redis.Client, prefix string, ks []string, held map[string]int) {
	owner := map[string]string{} // key → name
	seen := map[string]string{}  // the prefix of a name's seen marks, one per factory → name
	for name := range held {
		tag := prefix + "{" + backend.Escape(name) + "}:"
		for _, k := range []string{"lock", "token", "permits", "queue"} {
			if o, dup := owner[tag+k]; dup {
				t.Errorf("names %q and %q share the key %q", o, name, tag+k)
			}
			owner[tag+k] = name
		}
		seen[tag+"seen:"] = name
	}
	got := map[string]bool{}
	for _, k := range ks {
		got[k] = true
		_, ok := owner[k]
		for p := range seen {
			ok = ok || strings.HasPrefix(k, p) && !strings.Contains(k[len(p):], ":")
		}
		if !ok {
			t.Errorf("key %q under the prefix belongs to no held name (%v)", k, held)
		}
	}
	for name := range held {
		// A mutex's value or a semaphore's permits: the lock key either way.
		want := prefix + "{" + backend.Escape(name) + "}:lock"
		if !got[want] {
			t.Errorf("%q is held but %q is missing (keys: %q)", name, want, ks)
		}
	}
}

// checkEtcdKeys: every key under prefix is <prefix><esc>/<limit>/<id>, one
// per holder, of a held name.
func checkEtcdKeys(t *testing.T, prefix string, ks []string, held map[string]int) {
	count := map[string]int{}
	for _, k := range ks {
		rest, ok := strings.CutPrefix(k, prefix)
		parts := strings.Split(rest, "/")
		if !ok || len(parts) != 3 {
			t.Errorf("key %q is not <prefix><escaped name>/<limit>/<id>", k)
			continue
		}
		found := false
		for name, limit := range held {
			if parts[0] == backend.Escape(name) && parts[1] == strconv.Itoa(limit) {
				count[name]++
				found = true
			}
		}
		if !found {
			t.Errorf("key %q belongs to no held name (%v)", k, held)
		}
	}
	for name, limit := range held {
		if count[name] != limit {
			t.Errorf("%q: %d keys for %d holders (keys %q)", name, count[name], limit, ks)
		}
	}
}

// FuzzOptions: lock.Apply and every backend's Acquire take any option
// values without panicking; a value the docs call invalid gets an error
// matching ErrInvalidOption, given to NewFactory or to the call, and a
// valid set of options works.
func FuzzOptions(f *testing.F) {
	ttls := []int64{0, -1, 1, int64(9 * time.Millisecond), int64(10 * time.Millisecond), int64(99 * time.Millisecond),
		int64(100 * time.Millisecond), int64(999 * time.Millisecond), int64(time.Second), int64(1500 * time.Millisecond),
		int64(time.Hour), int64(9_100_000_000 * time.Second), math.MaxInt64, math.MinInt64}
	ns := []int16{-1, 0, 1, 2, 64, 1024, 1025}
	for bi := range backendNames {
		for i, ttl := range ttls {
			n := ns[i%len(ns)]
			f.Add(uint8(bi), ttl, n, []string{"", "d", "../../etc"}[i%3], []string{"", "p/", "a\x00b", "{x}"}[i%4], int64(i-3))
		}
	}
	f.Fuzz(func(t *testing.T, bi uint8, ttl int64, n int16, dir, prefix string, extra int64) {
		b := backendNames[int(bi)%len(backendNames)]
		d := time.Duration(ttl)
		var opts []lock.Option
		invalid := false
		why := ""
		bad := func(reason string) { invalid, why = true, why+reason+"; " }

		opts = append(opts, lock.WithTTL(d))
		switch {
		case d <= 0:
			bad("TTL not positive")
		case b == "redislock" && d < redislock.MinTTL:
			bad("TTL below redislock.MinTTL")
		case b == "filelock" && d < filelock.MinStaleAfter:
			bad("TTL below filelock.MinStaleAfter")
		case b == "etcdlock" && (d < time.Second || d%time.Second != 0):
			bad("TTL not whole seconds ≥ 1s")
		}
		if int(n) != 1 || extra%3 == 0 {
			opts = append(opts, lock.WithMaxConcurrent(int(n)))
			switch {
			case n < 1:
				bad("n < 1")
			case b == "flock" && int(n) > flock.MaxPermits:
				bad("n > flock.MaxPermits")
			}
		}
		// Directories stay inside the test's own: a fuzzed path is only a
		// component, hex-encoded so it cannot climb out.
		if dir == "" {
			opts = append(opts, lock.WithDir(""))
			bad("empty dir")
		} else {
			opts = append(opts, lock.WithDir(filepath.Join(t.TempDir(), fmt.Sprintf("%x", dir[:min(len(dir), 40)]))))
		}
		if prefix != "" {
			prefix = "chaos-fuzz/" + prefix
		}
		opts = append(opts, lock.WithKeyPrefix(prefix))
		if b == "pglock" && strings.IndexByte(prefix, 0) >= 0 {
			bad("NUL in pglock prefix")
		}
		switch b {
		case "flock":
			opts = append(opts, flock.WithSweepAfter(time.Duration(extra)))
			if extra < 0 {
				bad("negative WithSweepAfter")
			}
		case "pglock":
			s := int(extra % 100)
			opts = append(opts, pglock.WithSessions(s))
			if s < 1 || s > 64 {
				bad("WithSessions outside 1..64")
			}
		default:
			opts = append(opts, lock.WithAutoRenew(extra%2 == 0))
		}

		// Apply itself: no panic, and the root's own rules.
		if _, err := lock.Apply(lock.Options{}, opts...); err != nil && !errors.Is(err, lock.ErrInvalidOption) {
			t.Fatalf("lock.Apply: %v does not match ErrInvalidOption", err)
		}
		// Pglock's sessions and a large semaphore are a real cost on the
		// shared server; keep the cases that would take minutes to the
		// validation path.
		heavy := (b == "pglock" || b == "etcdlock" || b == "redislock") && n > 64
		for _, where := range []string{"NewFactory", "Acquire"} {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			var fac acquirer
			var err error
			var h lock.Holder
			name := fmt.Sprintf("fuzz-options-%d-%d", time.Now().UnixNano(), fuzzSeq.Add(1))
			if where == "NewFactory" {
				fac = newFactory(t, b, opts...)
				if heavy && !invalid {
					cancel()
					fac.close()
					continue
				}
				h, err = fac.acquire(ctx, name)
			} else {
				fac = newFactory(t, b)
				if heavy && !invalid {
					cancel()
					fac.close()
					continue
				}
				h, err = fac.acquire(ctx, name, opts...)
			}
			if h != nil {
				h.Release()
			}
			fac.close()
			cancel()
			switch {
			case invalid && !errors.Is(err, lock.ErrInvalidOption):
				t.Errorf("%s: options given to %s (%s): Acquire = %v; want ErrInvalidOption", b, where, why, err)
			case !invalid && err != nil && b == "pglock" && n > 1 && !utf8.ValidString(prefix) && !strict():
				t.Logf("known issue (%s): %v", known["pglock"]["prefix"], err)
			case !invalid && err != nil && b == "etcdlock" && d > etcdMaxTTL && !strict():
				t.Logf("known issue (%s): %v", known["etcdlock"]["ttl"], err)
			case !invalid && err != nil:
				t.Errorf("%s: valid options given to %s (ttl %v, n %d, extra %d): Acquire = %v", b, where, d, n, extra, err)
			}
		}
	})
}

// etcdMaxTTL is etcd's largest lease (MaxLeaseTTL, 9,000,000,000 s).
const etcdMaxTTL = 9_000_000_000 * time.Second
