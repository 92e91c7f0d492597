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
// its lease still runs.
//   - A mutex is released by its holder's id, as the holder's own Release
//     would: handed to the first waiter of its queue, with the next token,
//     or deleted, keeping the token counter. Two scripts, two round trips:
//     lua/break.lua reads the holder (and raises the fence, below), then
//     lua/mutex_release.lua, which acts only while that holder still has
//     the lock: if it released meanwhile, or its lease ran out, the name
//     has moved on and Break leaves it alone.
//   - A semaphore loses every live permit in one script (lua/break.lua),
//     which wakes its waiters as a release does (a PUBLISH on the name's
//     channel) and keeps the token counter. So does a name held shared
//     (WithShared): its readers; the first writer queued behind them is
//     then handed the name by a second script, the release of no reader,
//     as the last reader's release would.
//
// Either way the next holder's token is larger than every freed one, and
// the fence record of the key equal to name (Fence.Key(name), on the same
// server and key prefix) is raised to one above the highest freed token,
// unless it is higher already, and created if absent, before the lock is
// freed: from then on that fence rejects the freed holders' tokens, even
// before the next holder writes. Fences under other keys learn nothing
// until the next holder writes through them with its larger token.
//
// A freed holder that is still alive finds its lock gone at its next
// renewal (see the guide's "Loss" section), Extend or Release: Done closes
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
	k := keysFor(o.KeyPrefix, name).of(f.id)
	fk := (&store{prefix: cmp.Or(o.KeyPrefix, DefaultKeyPrefix)}).key("fence/", name)
	ls := f.leaseOf(&o)
	res, err := breakScript.Run(ctx, f.c, []string{k.lock, k.permits, fk, k.queue}, k.channel, ls.ttl.Milliseconds()).Slice()
	if err != nil {
		return fmt.Errorf("redislock: break %q: %w", name, err)
	}
	if len(res) == 0 {
		return fmt.Errorf("redislock: break: %w: %q", lock.ErrNotHeld, name)
	}
	ls.limit = 1
	var id string
	switch kind, _ := res[0].(string); {
	case kind == "w":
		// Readers freed, a writer waits for them: hand it the name.
		id, ls.shared = newID(), true
	case len(res) < 2:
		return nil // a semaphore's permits, or a foreign value, are gone
	default:
		id, _ = res[1].(string)
	}
	s, keys, args := f.releaseCall(k, id, ls, 0, "")
	if err := s.Run(ctx, f.c, keys, args...).Err(); err != nil {
		return fmt.Errorf("redislock: break %q: %w", name, err)
	}
	return nil
}
