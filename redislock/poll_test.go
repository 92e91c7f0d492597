package redislock

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// countClient counts the attempts of the acquire scripts: every attempt
// runs EVALSHA once (and EVAL only after NOSCRIPT).
type countClient struct {
	*redis.Client
	acquires atomic.Int64
}

func (c *countClient) EvalSha(ctx context.Context, sha string, keys []string, args ...any) *redis.Cmd {
	if sha == mutexAcquire.Hash() || sha == semAcquire.Hash() {
		c.acquires.Add(1)
	}
	return c.Client.EvalSha(ctx, sha, keys, args...)
}

// A waiter on a key set without an expiry (an operator's SET, PTTL -1) is
// not told when the lease ends, so it polls at the longest interval, not as
// fast as it can.
func TestWaitOnKeyWithoutExpiry(t *testing.T) {
	rdb := newClient(t)
	cc := &countClient{Client: rdb}
	f := NewFactory(cc, WithKeyPrefix(testPrefix), WithLogger(nil))
	defer f.Close()
	name := uniq(t, "x")
	k := keysFor(testPrefix, name)
	if err := rdb.Set(ctxT(t), k.lock, "set by an operator", 0).Err(); err != nil {
		t.Fatal(err)
	}
	defer rdb.Del(ctx0(), k.lock)
	const wait = time.Second // below maxPoll
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	if _, err := f.Acquire(ctx, name, WithWait()); !errors.Is(err, ErrLocked) {
		t.Fatalf("Acquire = %v; want ErrLocked", err)
	}
	// The first attempt, the one right after subscribing, and the one once
	// the subscription is confirmed; the next is due maxPoll later.
	n := cc.acquires.Load()
	t.Logf("%d acquire attempts in %v of waiting on a key without expiry", n, wait)
	if n > 3 {
		t.Fatalf("%d acquire attempts in %v; want at most 3 (one poll per %v)", n, wait, maxPoll)
	}
}
