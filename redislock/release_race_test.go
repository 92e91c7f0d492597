package redislock

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/ubgo/lock"
)

// raceClient runs onRelease once the server has run a release script and
// before the reply reaches the holder: the moment at which a renewal or
// Extend that Redis ran right after the release finds the lock gone.
type raceClient struct {
	*redis.Client
	onRelease func(cmd *redis.Cmd) // set by the test before Release, from its goroutine
}

func (c *raceClient) EvalSha(ctx context.Context, sha string, keys []string, args ...any) *redis.Cmd {
	cmd := c.Client.EvalSha(ctx, sha, keys, args...)
	// On NOSCRIPT the script did not run; Script.Run falls back to Eval.
	if (sha == mutexRelease.Hash() || sha == semRelease.Hash()) && !redis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
		c.released(cmd)
	}
	return cmd
}

func (c *raceClient) Eval(ctx context.Context, script string, keys []string, args ...any) *redis.Cmd {
	cmd := c.Client.Eval(ctx, script, keys, args...)
	if script == mutexReleaseSrc || script == semReleaseSrc {
		c.released(cmd)
	}
	return cmd
}

func (c *raceClient) released(cmd *redis.Cmd) {
	if f := c.onRelease; f != nil {
		c.onRelease = nil
		f(cmd)
	}
}

// events records the factory's Observer events.
type events struct {
	mu  sync.Mutex
	got []lock.Event
}

func (e *events) Observe(_ context.Context, ev lock.Event) {
	e.mu.Lock()
	e.got = append(e.got, ev)
	e.mu.Unlock()
}

func (e *events) count(op lock.Op) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for _, ev := range e.got {
		if ev.Op == op {
			n++
		}
	}
	return n
}

// Release racing a renewal (or an Extend) already on its way: Redis runs
// the release first, the renewal finds no key, and its reply arrives
// before the release's. The holder held its lock until it released it,
// so Release succeeds and nothing reports a loss. Only if the release's
// own reply is lost does the renewal's finding stand: the holder is lost.
func TestReleaseRacesRenewal(t *testing.T) {
	rdb := newClient(t)
	ctx := ctxT(t)
	for _, limit := range []int{1, 2} {
		for _, racer := range []string{"renewal", "extend", "release fails"} {
			t.Run(racer+"/"+map[int]string{1: "mutex", 2: "permit"}[limit], func(t *testing.T) {
				rc := &raceClient{Client: rdb}
				obs := &events{}
				f := NewFactory(rc, WithKeyPrefix(testPrefix), WithLogger(nil), WithObserver(obs))
				defer f.Close()
				// A long lease: the loop renews nothing by itself while the
				// test runs; the test sends the renewal.
				h, err := f.Acquire(ctx, uniq(t, "x"), WithMaxConcurrent(limit), WithTTL(time.Minute), WithAutoRenew(true))
				if err != nil {
					t.Fatal(err)
				}
				// As the loop does when it sends a renewal: Release finds
				// it in flight.
				f.rn.mu.Lock()
				h.inflight = true
				f.rn.mu.Unlock()
				var extendErr error
				rc.onRelease = func(cmd *redis.Cmd) {
					if held(t, rdb, h) {
						t.Fatal("the release script left the lock in Redis")
					}
					if racer == "extend" {
						extendErr = h.Extend(ctx)
						return
					}
					f.wg.Add(1)
					f.rn.renew([]*Holder{h})
					if racer == "release fails" {
						cmd.SetErr(errors.New("injected: release reply lost"))
					}
				}
				err = h.Release()
				if rc.onRelease != nil {
					t.Fatal("the release script never ran")
				}
				if racer == "release fails" {
					// Whether this release or something else removed the
					// lock is unknown; the renewal found it gone.
					if !errors.Is(err, lock.ErrLockLost) || !errors.Is(h.Err(), lock.ErrLockLost) || !isClosed(h.Done()) {
						t.Fatalf("Release = %v, Err = %v, Done closed %v; want lost", err, h.Err(), isClosed(h.Done()))
					}
					if n := obs.count(lock.OpLost); n != 1 {
						t.Fatalf("%d lost events, want 1", n)
					}
					return
				}
				if err != nil || h.Err() != nil || !isClosed(h.Done()) {
					t.Fatalf("Release = %v, Err = %v, Done closed %v; want a clean release", err, h.Err(), isClosed(h.Done()))
				}
				if n := obs.count(lock.OpLost); n != 0 {
					t.Fatalf("%d lost events for a lock held until its release", n)
				}
				if racer == "extend" && !errors.Is(extendErr, lock.ErrLockLost) {
					t.Fatalf("Extend racing Release = %v, want ErrLockLost", extendErr)
				}
			})
		}
	}
}

// held reports whether h's lock or permit is in Redis.
func held(t *testing.T, rdb *redis.Client, h *Holder) bool {
	t.Helper()
	if h.ls.limit == 1 {
		n, err := rdb.Exists(ctx0(), h.k.lock).Result()
		if err != nil {
			t.Fatal(err)
		}
		return n == 1
	}
	_, err := rdb.ZScore(ctx0(), h.k.lock, semID(h.id)).Result()
	if err != nil && err != redis.Nil {
		t.Fatal(err)
	}
	return err == nil
}
