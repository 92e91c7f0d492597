package redislock

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/backend"
)

// Fence is a lock.Fence kept in Redis: one string key per fenced key,
// <prefix>fence/{<escaped key>}, holding the highest accepted token in
// decimal. RejectIfStale is one script (lua/fence.lua), so the compare and
// the record are one atomic step on the server, and one round trip.
//
// The records have no expiry, on purpose: a fence that forgot its highest
// token would let a stale writer through. Run the server with a
// maxmemory-policy that never evicts keys without a TTL (noeviction, the
// default, or a volatile-* policy), and with persistence if the fence must
// survive a restart; like locks, a record written to a primary that fails
// over before replicating it is lost.
type Fence struct {
	c      Client
	prefix string
	err    error
}

// NewFence returns a fence on client. Of the options only WithKeyPrefix
// matters (default DefaultKeyPrefix); the others are accepted and ignored,
// so a factory's options can be passed as they are. A nil client or an
// invalid option is reported by the first call.
func NewFence(client Client, opts ...Option) *Fence {
	c, prefix, err := storeConfig(client, opts)
	return &Fence{c: c, prefix: prefix, err: err}
}

// Ledger is a lock.Ledger kept in Redis: one string key per recorded key,
// <prefix>done/{<escaped key>}, holding the token of the holder that
// recorded it. Done is EXISTS and MarkDone is SET NX, each one command.
// Records never expire; an operator re-runs a key's work by deleting its
// record (DEL). The same maxmemory-policy and persistence caveats as
// Fence apply.
type Ledger struct {
	c      Client
	prefix string
	err    error
}

// NewLedger returns a ledger on client, configured like NewFence.
func NewLedger(client Client, opts ...Option) *Ledger {
	c, prefix, err := storeConfig(client, opts)
	return &Ledger{c: c, prefix: prefix, err: err}
}

func storeConfig(client Client, opts []Option) (Client, string, error) {
	o, err := lock.Apply(lock.Options{}, opts...)
	if isNil(client) {
		err = errors.Join(err, fmt.Errorf("redislock: %w: nil Redis client", lock.ErrInvalidOption))
	}
	prefix := o.KeyPrefix
	if prefix == "" {
		prefix = DefaultKeyPrefix
	}
	return client, prefix, err
}

// Key returns the Redis key that holds key's fence record. Its hash tag is
// {<escaped key>}, the one the lock of the same name uses, so a script of
// your own that checks the fence and writes data keys tagged alike runs on
// one cluster slot.
func (f *Fence) Key(key string) string { return f.prefix + "fence/{" + backend.Escape(key) + "}" }

// Key returns the Redis key that holds key's ledger record.
func (l *Ledger) Key(key string) string { return l.prefix + "done/{" + backend.Escape(key) + "}" }

// RejectIfStale records token as the highest for key, or returns an error
// matching lock.ErrStaleToken, recording nothing, if a higher token is
// recorded or token is 0.
func (f *Fence) RejectIfStale(ctx context.Context, key string, token uint64) error {
	if err := backend.CheckStore(ctx, f.err, key); err != nil {
		return err
	}
	if token == 0 {
		return fmt.Errorf("redislock: %w: %q: token 0 is never issued to a holder", lock.ErrStaleToken, key)
	}
	res, err := fenceScript.Run(ctx, f.c, []string{f.Key(key)}, strconv.FormatUint(token, 10)).Slice()
	if err != nil {
		return fmt.Errorf("redislock: fence: %w", err)
	}
	if st, _ := toInt(res[0]); st == 1 {
		return nil
	}
	if len(res) < 2 {
		return fmt.Errorf("redislock: fence: unexpected reply %v", res)
	}
	return fmt.Errorf("redislock: %w: %q: token %d is below %v", lock.ErrStaleToken, key, token, res[1])
}

// Done reports whether key is recorded.
func (l *Ledger) Done(ctx context.Context, key string) (bool, error) {
	if err := backend.CheckStore(ctx, l.err, key); err != nil {
		return false, err
	}
	p := l.c.Pipeline()
	n := p.Exists(ctx, l.Key(key))
	if _, err := p.Exec(ctx); err != nil {
		return false, fmt.Errorf("redislock: ledger: %w", err)
	}
	return n.Val() == 1, nil
}

// MarkDone records key as done by token, unless it already is: the first
// record wins and a repeated call changes nothing.
func (l *Ledger) MarkDone(ctx context.Context, key string, token uint64) error {
	if err := backend.CheckStore(ctx, l.err, key); err != nil {
		return err
	}
	p := l.c.Pipeline()
	p.SetNX(ctx, l.Key(key), strconv.FormatUint(token, 10), 0)
	if _, err := p.Exec(ctx); err != nil {
		return fmt.Errorf("redislock: ledger: %w", err)
	}
	return nil
}
