package redislock

import (
	"testing"
	"time"
)

// A request of a factory that reaches Redis after a newer request of the
// same factory took the name takes nothing, even once the name is free
// again (the factory's seen mark); the attempt it belongs to, if it still
// waits for the reply, looks again at once and gets the name.
func TestSeenMarkRefusesOlderRequest(t *testing.T) {
	rdb := newClient(t)
	f := testFactory(t, rdb)
	ctx := ctxT(t)
	name := uniq(t, "x")
	old := f.newAttempt(ctx, name, &f.cfg.Options, false)
	sent := f.seq.Add(1) // old's request, on its way

	h, err := f.Acquire(ctx, name) // a newer request takes the name
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Release(); err != nil {
		t.Fatal(err)
	}

	// old's request arrives now: the name is free, and it takes nothing.
	k, ls := old.k, old.ls
	res, err := mutexAcquire.Run(ctx, rdb, []string{k.lock, k.token, k.seen, k.permits}, old.id, ls.ttl.Milliseconds(), time.Now().UnixMilli(), ls.meta, tokenRetention.Milliseconds(), sent).Result()
	if err != nil {
		t.Fatal(err)
	}
	if r, err := parseReply(res); err != nil || r.status != -3 {
		t.Fatalf("an older request on a free name: %v (%+v, %v); want -3, look again", res, r, err)
	}
	if n, _ := rdb.Exists(ctx, k.lock).Result(); n != 0 {
		t.Fatal("the older request left the lock set")
	}

	// The attempt itself looks again with a new number and takes it.
	g, _, err := old.try()
	if err != nil {
		t.Fatalf("the attempt's own next try: %v", err)
	}
	if g.Token() <= h.Token() {
		t.Errorf("token %d after %d", g.Token(), h.Token())
	}
	if err := g.Release(); err != nil {
		t.Fatal(err)
	}
}

// The seen mark is one key per name and factory, not one per acquisition:
// many acquisitions of a name by one factory leave the lock's keys, the
// token counter and one mark.
func TestSeenMarkOneKeyPerFactory(t *testing.T) {
	rdb := newClient(t)
	f := testFactory(t, rdb)
	ctx := ctxT(t)
	name := uniq(t, "x")
	for range 20 {
		h, err := f.Acquire(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if err := h.Release(); err != nil {
			t.Fatal(err)
		}
	}
	k := keysFor(testPrefix, name).of(f.id)
	keys, err := rdb.Keys(ctx, globQuote(k.token[:len(k.token)-len("token")])+"*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 2 {
		t.Fatalf("keys after 20 acquisitions: %v; want the token counter and the factory's seen mark", keys)
	}
	if ttl := rdb.PTTL(ctx, k.seen).Val(); ttl <= 0 || ttl > 2*DefaultTTL {
		t.Errorf("seen mark PTTL %v; want at most two TTLs", ttl)
	}
}
