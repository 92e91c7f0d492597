package redislock

import (
	"fmt"
	"maps"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/ubgo/lock"
)

// The keys of a name share its hash tag.
func TestKeysFor(t *testing.T) {
	k := keysFor("p:", "a/b")
	want := keys{lock: "p:{a%2Fb}:lock", token: "p:{a%2Fb}:token", permits: "p:{a%2Fb}:permits", queue: "p:{a%2Fb}:queue", channel: "p:{a%2Fb}:released"}
	if k != want {
		t.Errorf("keysFor = %+v, want %+v", k, want)
	}
}

// Holder.Key is the key that holds the lock: while held it exists and names
// the holder's id (a mutex's value begins with it, a semaphore's sorted set
// has it as a member); after Release the holder is gone from it.
func TestHolderKey(t *testing.T) {
	rdb := newClient(t)
	ctx := ctxT(t)
	f := NewFactory(rdb, WithKeyPrefix(testPrefix), WithLogger(nil))
	defer f.Close()

	t.Run("mutex", func(t *testing.T) {
		name := uniq(t, "m")
		h, err := f.Acquire(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if h.Key() != keysFor(testPrefix, name).lock {
			t.Errorf("Key() = %q, want the lock key %q", h.Key(), keysFor(testPrefix, name).lock)
		}
		v, err := rdb.Get(ctx, h.Key()).Result()
		if err != nil || !strings.HasPrefix(v, h.id) {
			t.Fatalf("GET %s = %q, %v; want a value beginning with the id %q", h.Key(), v, err, h.id)
		}
		if err := h.Release(); err != nil {
			t.Fatal(err)
		}
		if n, err := rdb.Exists(ctx, h.Key()).Result(); n != 0 || err != nil {
			t.Errorf("after Release EXISTS %s = %d, %v", h.Key(), n, err)
		}
	})
	t.Run("semaphore", func(t *testing.T) {
		name := uniq(t, "s")
		h, err := f.Acquire(ctx, name, WithMaxConcurrent(3))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := rdb.ZScore(ctx, h.Key(), semID(h.id)).Result(); err != nil {
			t.Fatalf("ZSCORE %s %s: %v; want the permit id as a member", h.Key(), semID(h.id), err)
		}
		if err := h.Release(); err != nil {
			t.Fatal(err)
		}
		if err := rdb.ZScore(ctx, h.Key(), semID(h.id)).Err(); err != redis.Nil {
			t.Errorf("after Release ZSCORE %s = %v, want redis.Nil", h.Key(), err)
		}
	})
}

// A key prefix with glob characters matches only itself: List quotes it
// in its SCAN pattern. (Long, hashed names: locktest's List.)
func TestListGlobPrefix(t *testing.T) {
	rdb := newClient(t)
	ctx := ctxT(t)
	f := NewFactory(rdb, WithKeyPrefix(testPrefix+"[*]:"), WithLogger(nil))
	defer f.Close()
	base := uniq(t, "")
	want := map[string]uint64{}
	for i, name := range []string{base + "1", base + "2"} {
		h, err := f.Acquire(ctx, name, WithMaxConcurrent(i+1))
		if err != nil {
			t.Fatal(err)
		}
		defer h.Release()
		want[name] = h.Token()
	}
	got := map[string]uint64{}
	for info, err := range f.List(ctx, base) {
		if err != nil {
			t.Fatal(err)
		}
		if len(info.Holders) != 1 {
			t.Fatalf("List: %+v; want one holder", info)
		}
		got[info.Name] = info.Holders[0].Token
	}
	if !maps.Equal(got, want) {
		t.Fatalf("List = %v; want %v", got, want)
	}
}

// List reads more names than one SCAN page holds, each once.
func TestListPages(t *testing.T) {
	rdb := newClient(t)
	ctx := ctxT(t)
	f := testFactory(t, rdb)
	base := uniq(t, "")
	want := map[string]uint64{}
	for i := range lock.ListPageSize + 2 {
		name := fmt.Sprintf("%s%04d", base, i)
		h, err := f.Acquire(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		defer h.Release()
		want[name] = h.Token()
	}
	got := map[string]uint64{}
	for info, err := range f.List(ctx, base) {
		if err != nil {
			t.Fatal(err)
		}
		got[info.Name] = info.Holders[0].Token
	}
	if !maps.Equal(got, want) {
		t.Fatalf("List yielded %d names; want %d", len(got), len(want))
	}
}
