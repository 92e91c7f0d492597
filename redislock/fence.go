package redislock

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/backend"
)

// Fence is a lock.Fence kept in Redis: one string key per fenced key,
// <prefix>fence/{<escaped key>}, holding the highest accepted token in
// decimal. RejectIfStale is one script (lua/fence.lua), so the compare and
// the record are one atomic step on the server, and one round trip; Apply
// runs the same script with a data key, so a write goes with them.
//
// The records have no expiry, on purpose: a fence that forgot its highest
// token would let a stale writer through. Run the server with a
// maxmemory-policy that never evicts keys without a TTL (noeviction, the
// default, or a volatile-* policy), and with persistence if the fence must
// survive a restart; like locks, a record written to a primary that fails
// over before replicating it is lost.
type Fence struct{ st *store }

// Ledger is a lock.Ledger kept in Redis: one string key per recorded key,
// <prefix>done/{<escaped key>}, holding the token of the holder that
// recorded it. IsDone is EXISTS and MarkDone is SET NX, each one command.
// Records never expire; an operator re-runs a key's work by deleting its
// record (DEL). The same maxmemory-policy and persistence caveats as
// Fence apply.
type Ledger struct{ st *store }

// NewFence returns a fence on client. Of the options only WithKeyPrefix
// matters (default DefaultKeyPrefix); the others are accepted and ignored,
// so a factory's options can be passed as they are. A nil client or an
// invalid option is reported by the first call. The fence does not close
// client.
func NewFence(client Client, opts ...Option) *Fence {
	return &Fence{st: newStore(client, opts)}
}

// NewLedger returns a ledger on client, configured like NewFence.
func NewLedger(client Client, opts ...Option) *Ledger {
	return &Ledger{st: newStore(client, opts)}
}

// store is the client and key prefix of a Fence or Ledger.
type store struct {
	c      Client
	err    error
	prefix string
}

func newStore(client Client, opts []Option) *store {
	o, err := lock.Apply(backend.Options(backendName), opts...)
	if isNil(client) {
		err = errors.Join(err, fmt.Errorf("redislock: %w: nil Redis client", lock.ErrInvalidOption))
	}
	return &store{c: client, err: err, prefix: cmp.Or(o.KeyPrefix, DefaultKeyPrefix)}
}

// key is the Redis key of key's record in the family kind ("fence/",
// "done/", "data/"): the hash tag is {<escaped key>}, the one the lock of
// the same name uses.
func (s *store) key(kind, key string) string {
	return s.prefix + kind + "{" + backend.Escape(key) + "}"
}

// Key returns the Redis key that holds key's fence record. Its hash tag is
// {<escaped key>}, the one the lock of the same name uses, so a script of
// your own that checks the fence and writes data keys tagged alike runs on
// one cluster slot.
func (f *Fence) Key(key string) string { return f.st.key("fence/", key) }

// DataKey returns <prefix>data/{<escaped key>}<suffix>: a key for Apply's
// data with the hash tag of key's fence record, apart from every lock,
// fence and ledger key.
func (f *Fence) DataKey(key, suffix string) string { return f.st.key("data/", key) + suffix }

// Key returns the Redis key that holds key's ledger record.
func (l *Ledger) Key(key string) string { return l.st.key("done/", key) }

// RejectIfStale records token as the highest for key, or returns an error
// matching lock.ErrStaleToken, recording nothing, if a higher token is
// recorded or token is 0.
func (f *Fence) RejectIfStale(ctx context.Context, key string, token uint64) error {
	return f.run(ctx, key, token, "", nil)
}

// Apply is RejectIfStale and SET dataKey value in the same script: the write
// happens, together with the record of token, only if token is not stale,
// so no newer holder's write can come between the check and it. A stale
// token returns an error matching lock.ErrStaleToken and leaves dataKey
// untouched. value is sent as go-redis sends any command argument; the
// data key gets no expiry.
//
// dataKey must carry key's hash tag, {<escaped key>}, so that the script
// runs on one slot of Redis Cluster: build it with DataKey, or as any key
// of your own containing the tag of Key(key). A key without the tag, or one
// of redislock's own keys for key (its fence and ledger records, the lock's
// keys), gets an error matching lock.ErrInvalidOption, on a cluster or not.
//
//	err := fence.Apply(ctx, "exports/today", h.Token(), fence.DataKey("exports/today", ""), data)
func (f *Fence) Apply(ctx context.Context, key string, token uint64, dataKey string, value any) error {
	if dataKey == "" {
		return fmt.Errorf("redislock: %w: empty data key for %q", lock.ErrInvalidOption, key)
	}
	return f.run(ctx, key, token, dataKey, value)
}

// hashTag is the part of a Redis key that decides its cluster slot: the
// bytes between the first '{' and the next '}' if there are some, else the
// whole key.
func hashTag(key string) string {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			return key[i+1 : i+1+j]
		}
	}
	return key
}

// dataKeyOK reports whether dataKey may hold Apply's data for key: it has
// the hash tag of key's fence record and is none of the keys redislock
// keeps for key (the record itself, the ledger record, the lock's keys).
func (f *Fence) dataKeyOK(key, dataKey string) bool {
	fk := f.Key(key)
	lockKeys := strings.TrimSuffix(keysFor(f.st.prefix, key).lock, "lock") // <prefix>{<esc>}:
	return hashTag(dataKey) == hashTag(fk) && dataKey != fk && dataKey != f.st.key("done/", key) &&
		!strings.HasPrefix(dataKey, lockKeys)
}

// run runs the fence script, which also sets dataKey to value unless
// dataKey is "".
func (f *Fence) run(ctx context.Context, key string, token uint64, dataKey string, value any) error {
	if err := backend.CheckStore(ctx, f.st.err, key); err != nil {
		return err
	}
	fk := f.Key(key)
	if dataKey != "" && !f.dataKeyOK(key, dataKey) {
		return fmt.Errorf("redislock: %w: data key %q for %q: it must carry the hash tag of %q and be none of redislock's own keys (see Fence.DataKey)", lock.ErrInvalidOption, dataKey, key, fk)
	}
	if token == 0 {
		return fmt.Errorf("redislock: %w: %q: token 0 is never issued to a holder", lock.ErrStaleToken, key)
	}
	keys, args := []string{fk}, []any{strconv.FormatUint(token, 10)}
	if dataKey != "" {
		keys, args = append(keys, dataKey), append(args, value)
	}
	res, err := fenceScript.Run(ctx, f.st.c, keys, args...).Slice()
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

// IsDone reports whether key is recorded.
func (l *Ledger) IsDone(ctx context.Context, key string) (bool, error) {
	if err := backend.CheckStore(ctx, l.st.err, key); err != nil {
		return false, err
	}
	p := l.st.c.Pipeline()
	n := p.Exists(ctx, l.Key(key))
	if _, err := p.Exec(ctx); err != nil {
		return false, fmt.Errorf("redislock: ledger: %w", err)
	}
	return n.Val() == 1, nil
}

// MarkDone records key as done by token, unless it already is: the first
// record wins and a repeated call changes nothing.
func (l *Ledger) MarkDone(ctx context.Context, key string, token uint64) error {
	if err := backend.CheckStore(ctx, l.st.err, key); err != nil {
		return err
	}
	p := l.st.c.Pipeline()
	p.SetNX(ctx, l.Key(key), strconv.FormatUint(token, 10), 0)
	if _, err := p.Exec(ctx); err != nil {
		return fmt.Errorf("redislock: ledger: %w", err)
	}
	return nil
}
