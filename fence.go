package lock

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// ErrStaleToken is returned by a [Fence] for a write whose fencing token is
// lower than one the resource has already accepted: the writer's lock was
// lost, a later holder has written since, and this write must be dropped.
// It is not a lock error: it wraps nothing, and a caller that sees it should
// stop, not retry with the same token.
var ErrStaleToken = errors.New("lock: stale fencing token")

// A Fence protects a resource from holders that lost their lock without
// knowing it (a GC pause or a partition longer than the lease): every write
// carries the writer's [Holder.Token], and the resource refuses a token lower
// than the highest it has accepted.
//
// RejectIfStale atomically compares token with the highest token recorded
// for key. If token is lower (or zero, which no holder is ever given) it
// records nothing and returns an error matching [ErrStaleToken]; otherwise
// it records token as the highest — an equal token is accepted, so one holder
// may write many times — and returns nil.
//
// A check in one store followed by a write to another leaves a gap: a writer
// can pass the check, pause, and write after a newer holder. The fence closes
// that gap only where the check and the write are one atomic step: the same
// SQL statement or transaction, the same Redis script, the same etcd Txn, or
// [MemoryFence.Apply] in one process. docs/design/patterns.md shows each.
//
// Tokens are per lock name: every writer fenced under one key must take its
// token from the same lock name, or the comparison means nothing.
//
// Implementations for durable stores do the compare-and-record in one
// statement, for example in Postgres:
//
//	INSERT INTO lock_fences (key, token) VALUES ($1, $2)
//	ON CONFLICT (key) DO UPDATE SET token = EXCLUDED.token
//	WHERE lock_fences.token <= EXCLUDED.token
//	-- no row affected: the token is stale
//
// A fence column on the guarded row itself is better still, since the check
// then is the write:
//
//	UPDATE exports SET data = $2, fence = $3 WHERE id = $1 AND fence <= $3
type Fence interface {
	RejectIfStale(ctx context.Context, key string, token uint64) error
}

// MemoryFence is a [Fence] kept in this process's memory: the one for tests,
// and correct for a resource that lives in the same process as all its
// writers. The zero value is not usable; call [NewMemoryFence].
type MemoryFence struct {
	mu   sync.Mutex
	keys map[string]*fenceKey
}

type fenceKey struct {
	mu      sync.Mutex // held across Apply's write, so check and write are one step
	highest uint64
}

// NewMemoryFence returns an empty fence: every key accepts any token above 0.
func NewMemoryFence() *MemoryFence { return &MemoryFence{keys: map[string]*fenceKey{}} }

func (f *MemoryFence) key(k string) *fenceKey {
	f.mu.Lock()
	defer f.mu.Unlock()
	e := f.keys[k]
	if e == nil {
		e = &fenceKey{}
		f.keys[k] = e
	}
	return e
}

// RejectIfStale records token for key unless it is lower than the highest
// recorded, in which case it returns an error matching ErrStaleToken.
func (f *MemoryFence) RejectIfStale(ctx context.Context, key string, token uint64) error {
	return f.Apply(ctx, key, token, nil)
}

// Apply runs write only if token is not stale for key, and holds key's fence
// while write runs, so no other write through this fence to the same key can
// slip between the check and the write. The token stays recorded even when
// write fails: it was a real holder's, so every lower token is stale anyway.
func (f *MemoryFence) Apply(ctx context.Context, key string, token uint64, write func() error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	e := f.key(key)
	e.mu.Lock()
	defer e.mu.Unlock()
	if token == 0 || token < e.highest {
		return staleError(key, token, e.highest)
	}
	e.highest = token
	if write == nil {
		return nil
	}
	return write()
}

// Highest returns the highest token accepted for key, 0 if none.
func (f *MemoryFence) Highest(key string) uint64 {
	e := f.key(key)
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.highest
}

func staleError(key string, token, highest uint64) error {
	if token == 0 {
		return fmt.Errorf("%w: %q: token 0 is never issued to a holder", ErrStaleToken, key)
	}
	return fmt.Errorf("%w: %q: token %d is below %d", ErrStaleToken, key, token, highest)
}
