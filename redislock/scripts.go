package redislock

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/ubgo/lock/backend"
)

// The Lua scripts, in lua/. Every operation is one script so that it is one
// round trip and atomic on the server. All keys of one name share the hash
// tag {<escaped name>}, so the scripts also run on Redis Cluster. Each file
// states its KEYS, ARGV and reply, and runs on its own, for example
//
//	redis-cli --eval lua/mutex_acquire.lua 'lock:{x}:lock' 'lock:{x}:token' \
//	    'lock:{x}:seen:f00d' 'lock:{x}:permits' , '0123:' 30000 1764000000000 '{}' 86400000 1
//
// The keys of a name (see keysFor): lock, token (counter), permits, queue,
// and for acquire and release the factory's seen mark (see keys.of). The
// lock is a string while a mutex holds the name: "id:token:since:meta",
// then flags once somebody waits (lua/mutex_acquire.lua), the waiters
// themselves in the queue, a list. While a semaphore or shared name is
// held it is a sorted set of permit (or reader) ids scored by expiry in
// server milliseconds, and permits a hash: permit id -> "token:since:meta",
// "#limit" -> the limit (1 for readers), "#r" while readers wait behind
// queued writers. So one key says which kind holds the name: a mutex's
// SET NX fails on permits, and no acquire checks another kind's keys
// unless the name is held.
//
// A holder is identified by a random id that is unique per acquisition;
// only the id is compared, so a holder whose acquire reply was lost can
// still be cleaned up by its id. The mutex scripts get the id with its
// ':' ("id:"), the prefix of the value; the semaphore scripts get it
// without.
//
// Each factory numbers the requests it sends (Factory.seq), and a name
// keeps, per factory that took it lately, the number of the last request
// of that factory that took it (its seen mark, two TTLs after the take):
// a request of the factory whose number is not above it takes nothing. A
// release raises it again, for a TTL, after a hold of more than half a
// TTL, and so do the cleanup of a failed attempt and a waiter that gives
// up. An acquire request that reaches the server only after its attempt
// was given up (delayed past the client's timeout, then cleaned up; or
// retried by the client on another connection, held, and released) would
// otherwise take the name for an id nobody holds, for a whole TTL.
//
// Numbers: Lua numbers are doubles and redis.call turns them into strings
// with 14 significant digits, so every number written to Redis is formatted
// with %d first.
var (
	//go:embed lua/mutex_acquire.lua
	mutexAcquireSrc string
	//go:embed lua/mutex_release.lua
	mutexReleaseSrc string
	//go:embed lua/mutex_extend.lua
	mutexExtendSrc string
	//go:embed lua/mutex_extend_many.lua
	mutexExtendManySrc string
	//go:embed lua/shared_acquire.lua
	sharedAcquireSrc string
	//go:embed lua/shared_release.lua
	sharedReleaseSrc string
	//go:embed lua/sem_acquire.lua
	semAcquireSrc string
	//go:embed lua/sem_release.lua
	semReleaseSrc string
	//go:embed lua/sem_extend.lua
	semExtendSrc string
	//go:embed lua/inspect.lua
	inspectSrc string
	//go:embed lua/fence.lua
	fenceSrc string
)

var (
	mutexAcquire  = redis.NewScript(mutexAcquireSrc)
	mutexRelease  = redis.NewScript(mutexReleaseSrc)
	mutexExtend   = redis.NewScript(mutexExtendSrc)
	mutexExtendN  = redis.NewScript(mutexExtendManySrc)
	sharedAcquire = redis.NewScript(sharedAcquireSrc)
	sharedRelease = redis.NewScript(sharedReleaseSrc)
	semAcquire    = redis.NewScript(semAcquireSrc)
	semRelease    = redis.NewScript(semReleaseSrc)
	semExtend     = redis.NewScript(semExtendSrc)
	inspectScript = redis.NewScript(inspectSrc)
	fenceScript   = redis.NewScript(fenceSrc)
)

// keys are the Redis keys and channel of one name, all tagged with
// {<escaped name>} so that they share a cluster slot. queue is a mutex's
// waiters (see lua/mutex_acquire.lua), seen a factory's mark (see of).
type keys struct {
	lock, token, permits, queue, channel, seen string
}

func keysFor(prefix, name string) keys {
	if prefix == "" {
		prefix = DefaultKeyPrefix
	}
	return keysOfEscaped(prefix, backend.Escape(name))
}

// keysOfEscaped is keysFor for a name known by its escaped form (List).
func keysOfEscaped(prefix, esc string) keys {
	return keysOfBase(prefix + "{" + esc + "}:")
}

// keysOfBase is keysFor for the common start of a name's keys,
// "<prefix>{<escaped name>}:" (a grant names the lock key).
func keysOfBase(base string) keys {
	// One allocation for the five: each is a slice of it.
	all := base + "lock" + base + "token" + base + "permits" + base + "queue" + base + "released"
	next := func(suffix string) string {
		k := all[:len(base)+len(suffix)]
		all = all[len(k):]
		return k
	}
	return keys{lock: next("lock"), token: next("token"), permits: next("permits"), queue: next("queue"), channel: next("released")}
}

// of returns k with the seen mark of the factory with this id: the number
// of the last request of that factory that took the name (see the
// scripts' doc above).
func (k keys) of(factory string) keys {
	k.seen = strings.TrimSuffix(k.lock, "lock") + "seen:" + factory
	return k
}

// releaseCall is the script, keys and arguments that release the lock,
// reader or permit with this id (a mutex, or a name its last reader
// leaves, to its first waiter). A seq above 0 raises k's seen mark to it,
// for a TTL; entry is the caller's queue entry if it may have queued for a
// mutex (see attempt.entry), which the script takes out.
func (f *Factory) releaseCall(k keys, id string, ls lease, seq uint64, entry string) (*redis.Script, []string, []any) {
	mark, ms := "", ls.ttl.Milliseconds()
	if seq > 0 {
		mark = strconv.FormatUint(seq, 10)
	}
	switch {
	case ls.limit > 1:
		return semRelease, []string{k.lock, k.seen, k.permits}, []any{semID(id), k.channel, mark, ms}
	case ls.shared:
		return sharedRelease, []string{k.lock, k.seen, k.token, k.queue, k.permits}, []any{semID(id), time.Now().UnixMilli(), f.heard(), tokenRetention.Milliseconds(), mark, ms}
	}
	keys := []string{k.lock, k.seen, k.token, k.queue}
	args := []any{id, time.Now().UnixMilli(), f.heard(), tokenRetention.Milliseconds()}
	switch {
	case entry != "":
		keys = append(keys, k.permits)
		args = append(args, mark, ms, entry)
	case seq > 0:
		args = append(args, mark, ms)
	}
	return mutexRelease, keys, args
}

// heard is "1" if every subscriber of a channel is on the factory's one
// server, so that a PUBLISH that reaches nobody means nobody listens.
func (f *Factory) heard() string {
	if f.together.Load() {
		return "1"
	}
	return "0"
}

// extendCall is the script, keys and arguments that extend a holder of
// lease ls by its TTL.
func extendCall(k keys, id string, ls lease) (*redis.Script, []string, []any) {
	if !ls.permit() {
		return mutexExtend, []string{k.lock}, []any{id, ls.ttl.Milliseconds()}
	}
	return semExtend, []string{k.lock, k.permits}, []any{semID(id), ls.ttl.Milliseconds()}
}

func toInt(v any) (int64, error) {
	switch x := v.(type) {
	case int64:
		return x, nil
	case string:
		return strconv.ParseInt(x, 10, 64)
	}
	return 0, fmt.Errorf("unexpected %T", v)
}

func toUint(v any) (uint64, error) {
	switch x := v.(type) {
	case int64:
		if x < 0 {
			return 0, fmt.Errorf("negative")
		}
		return uint64(x), nil
	case string:
		return strconv.ParseUint(x, 10, 64)
	}
	return 0, fmt.Errorf("unexpected %T", v)
}

// newID returns a random id, unique per acquisition, in the form a mutex
// value starts with: 32 hex digits and a ':'.
func newID() string {
	var b [16]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:]) + ":"
}

// semID is id as a semaphore permit id, without the ':'.
func semID(id string) string { return id[:len(id)-1] }

// meta is what is stored with a holder for Inspect.
type meta struct {
	Owner    string            `json:"owner,omitempty"`
	Metadata map[string]string `json:"metadata,omitempty"`
}

// pipeScripts runs n scripts, call(i), in one pipeline, falling back to
// EVAL for a server that lost its script cache.
func pipeScripts(ctx context.Context, c Client, n int, call func(i int) (*redis.Script, []string, []any)) []*redis.Cmd {
	return pipeScriptsAcked(ctx, c, n, call, 0)
}

// pipeScriptsAcked is pipeScripts followed, if ack > 0, by a WAIT for ack
// replicas in the same pipeline (see WithReplicaAck): a script whose
// writes fewer replicas acknowledged fails with ErrNotReplicated.
func pipeScriptsAcked(ctx context.Context, c Client, n int, call func(i int) (*redis.Script, []string, []any), ack int) []*redis.Cmd {
	cmds := make([]*redis.Cmd, n)
	pipe := c.Pipeline()
	for i := range n {
		s, k, a := call(i)
		cmds[i] = pipe.EvalSha(ctx, s.Hash(), k, a...)
	}
	w := queueWait(ctx, pipe, c, ack)
	pipe.Exec(ctx)
	var again []int
	for i, cmd := range cmds {
		if redis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
			again = append(again, i)
		}
	}
	if len(again) > 0 {
		pipe := c.Pipeline()
		for _, i := range again {
			s, k, a := call(i)
			cmds[i] = s.Eval(ctx, pipe, k, a...)
		}
		w = queueWait(ctx, pipe, c, ack)
		pipe.Exec(ctx)
	}
	if err := w(); err != nil {
		for _, cmd := range cmds {
			if cmd.Err() == nil {
				cmd.SetErr(err)
			}
		}
	}
	return cmds
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
