package redislock

import (
	"cmp"
	"context"
	_ "embed"
	"fmt"

	"github.com/redis/go-redis/v9"
	"github.com/ubgo/lock"
)

//go:embed lua/break.lua
var breakSrc string

var breakScript = redis.NewScript(breakSrc)

// Break frees name under the factory's key prefix, whoever holds it: it is
// for an operator whose holder is gone (a crashed or frozen process) while
// its lease still runs. It is one script (lua/break.lua), one round trip,
// atomic on the server:
//   - the mutex's key, or every live permit of the semaphore, is deleted;
//     the token counter stays, so the next holder's token is larger than
//     every freed holder's;
//   - waiters are woken as by a release (a PUBLISH on the name's channel):
//     one of them gets the lock at once;
//   - the fence record of the key equal to name (Fence.Key(name), on the
//     same server and key prefix) is raised to one above the highest freed
//     token, unless it is higher already, and created if absent: from then
//     on that fence rejects the freed holders' tokens, even before the next
//     holder writes. Fences under other keys learn nothing until the next
//     holder writes through them with its larger token.
//
// A freed holder that is still alive finds its lock gone at its next
// renewal (within a third of its TTL) or Extend, or at Release: Done closes
// and Err matches ErrLockLost. Until then it may think it holds the lock,
// so only a fence protects a resource from it.
//
// Break returns an error matching lock.ErrNotHeld when nothing holds name,
// and lock.ErrInvalidName for a bad name.
func (f *Factory) Break(ctx context.Context, name string) error {
	o, err := f.resolve(name, nil)
	if err != nil {
		return err
	}
	k := keysFor(o.KeyPrefix, name)
	fk := (&store{prefix: cmp.Or(o.KeyPrefix, DefaultKeyPrefix)}).key("fence/", name)
	res, err := breakScript.Run(ctx, f.c, []string{k.lock, k.slots, k.permits, fk}, k.channel).Slice()
	if err != nil {
		return fmt.Errorf("redislock: break %q: %w", name, err)
	}
	if len(res) == 0 {
		return fmt.Errorf("redislock: break: %w: %q", lock.ErrNotHeld, name)
	}
	return nil
}
