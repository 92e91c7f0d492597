package redislock

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/ubgo/lock"
	"github.com/ubgo/lock/backend"
)

// ErrNotReplicated: fewer replicas than WithReplicaAck asks for
// acknowledged a lock's write in time. An Acquire that gets it has
// released what it took; a renewal that gets it is retried, and the
// holder's deadline decides.
var ErrNotReplicated = errors.New("redislock: lock not acknowledged by enough replicas")

type replicaAckKey struct{}

// WithReplicaAck makes every write that takes or renews a lock wait until n
// replicas of its primary acknowledged it (Redis WAIT, on the same
// connection, for a bounded time that the guide's Options section gives),
// and count only then: an Acquire returns once the lock
// is on n replicas, and a holder's deadline moves only with renewals that
// reached them. This narrows the window in which a failover to a replica
// that missed the lock admits a second holder; it does not close it (a
// replica can acknowledge and still not be the one promoted; Redis
// replication stays asynchronous). An Acquire costs one more round trip.
// Needs a *redis.Client (a primary, or a Sentinel failover client) or a
// *redis.ClusterClient. Factory option.
func WithReplicaAck(n int) Option {
	if n < 1 {
		return func(o *lock.Options) { o.Invalid(fmt.Sprintf("redislock.WithReplicaAck(%d): need at least 1", n)) }
	}
	return backend.Value(backendName, "WithReplicaAck", replicaAckKey{}, n)
}

// replicaAck is the factory's WithReplicaAck, 0 if not given.
func (f *Factory) replicaAck() int {
	n, _ := f.cfg.Options.Value(replicaAckKey{}).(int)
	return n
}

// queueWait queues a WAIT for ack replicas on pipe if ack > 0, and returns
// the check of its reply to run after Exec. WAIT counts the writes of its
// own connection, so c must be one server's client: a cluster client
// would send it to any node.
func queueWait(ctx context.Context, pipe redis.Pipeliner, c Client, ack int) func() error {
	if ack <= 0 {
		return func() error { return nil }
	}
	if _, ok := c.(*redis.Client); !ok {
		return func() error { return fmt.Errorf("%w: no single primary to ask (%T)", ErrNotReplicated, c) }
	}
	wait := time.Second
	if d, ok := ctx.Deadline(); ok {
		wait = min(wait, time.Until(d)/2)
	}
	wait = max(wait, time.Millisecond) // WAIT 0 would block for ever
	cmd := pipe.Do(ctx, "WAIT", ack, wait.Milliseconds())
	return func() error {
		n, err := cmd.Int64()
		switch {
		case err != nil:
			return fmt.Errorf("%w: WAIT: %v", ErrNotReplicated, err)
		case n < int64(ack):
			return fmt.Errorf("%w: %d of %d within %v", ErrNotReplicated, n, ack, wait)
		}
		return nil
	}
}

// primary is the client of the server that holds key: on a cluster its
// slot's master, else the factory's client.
func (f *Factory) primary(ctx context.Context, key string) Client {
	if cc, ok := f.c.(*redis.ClusterClient); ok {
		if node, err := cc.MasterForKey(ctx, key); err == nil {
			return node
		}
	}
	return f.c
}

// confirm waits until the lock h was just given reached the factory's
// WithReplicaAck replicas: an extend and a WAIT in one pipeline on the
// name's primary (extendOnce). Replication keeps the primary's order, so
// the acknowledgement of the extend covers the acquire or hand-off before
// it.
func (f *Factory) confirm(ctx context.Context, h *Holder) error {
	ctx, cancel := context.WithTimeout(ctx, h.ls.ttl/3)
	defer cancel()
	v, err := h.extendOnce(ctx)
	switch {
	case err != nil:
		return fmt.Errorf("redislock: acquire %q: %w", h.name, err)
	case v != 1:
		return fmt.Errorf("redislock: acquire %q: %w before it reached the replicas", h.name, ErrLockLost)
	}
	return nil
}
