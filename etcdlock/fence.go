package etcdlock

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/backend"
)

// Fence is a lock.Fence kept in etcd: one key per fenced key,
// <prefix>.fence/<escaped key>, whose value is the highest accepted token
// zero-padded to 20 digits, so that etcd's byte comparison of values is the
// numeric order over the whole uint64 range. RejectIfStale is one Txn:
//
//	If(Value(k) > token) Then(Get(k)) Else(Put(k, token))
//
// A comparison with a missing key is false in etcd, so the first token for
// a key takes the Else branch too. The leading '.' keeps the records out of
// every lock's directory: an escaped name never contains one.
//
// Records are plain keys without a lease, on purpose: a fence must not
// forget. They are as durable as the cluster's data; an operator never
// lowers one by hand.
type Fence struct{ st *store }

// Ledger is a lock.Ledger kept in etcd: one key per recorded key,
// <prefix>.done/<escaped key>, whose value is the token of the holder that
// recorded it. MarkDone is one Txn, If(CreateRevision(k) = 0) Then(Put(k)),
// so the first record wins; IsDone is a count-only Get. Records have no
// lease; an operator re-runs a key's work by deleting its record
// (etcdctl del).
type Ledger struct{ st *store }

// NewFence returns a fence on cli. Of the options only WithKeyPrefix matters
// (default DefaultKeyPrefix); the others are accepted and ignored, so a
// factory's options can be passed as they are. A nil client or an invalid
// option is reported by the first call. The fence does not close cli.
func NewFence(cli *clientv3.Client, opts ...Option) *Fence {
	return &Fence{st: newStore(cli, ".fence/", opts)}
}

// NewLedger returns a ledger on cli, configured like NewFence.
func NewLedger(cli *clientv3.Client, opts ...Option) *Ledger {
	return &Ledger{st: newStore(cli, ".done/", opts)}
}

// store is the client and key directory of a Fence or Ledger.
type store struct {
	cli *clientv3.Client
	err error
	dir string // <prefix>.fence/ or <prefix>.done/
}

func newStore(cli *clientv3.Client, sub string, opts []Option) *store {
	o, err := lock.Apply(backend.Options(backendName), opts...)
	if cli == nil {
		err = errors.Join(err, fmt.Errorf("etcdlock: %w: nil *clientv3.Client", lock.ErrInvalidOption))
	}
	return &store{cli: cli, err: err, dir: prefixOf(&o) + sub}
}

// key is the etcd key of key's record.
func (s *store) key(key string) string { return s.dir + backend.Escape(key) }

// Key returns the etcd key that holds key's fence record, for a Txn of your
// own (see Apply) or for operators.
func (f *Fence) Key(key string) string { return f.st.key(key) }

// Key returns the etcd key that holds key's ledger record.
func (l *Ledger) Key(key string) string { return l.st.key(key) }

// fenceValue is token as stored: 20 digits hold every uint64, and values of
// equal length compare bytewise in numeric order.
func fenceValue(token uint64) string { return fmt.Sprintf("%020d", token) }

// RejectIfStale records token as the highest for key, or returns an error
// matching lock.ErrStaleToken, recording nothing, if a higher token is
// recorded or token is 0.
func (f *Fence) RejectIfStale(ctx context.Context, key string, token uint64) error {
	return f.Apply(ctx, key, token)
}

// Apply is RejectIfStale with the caller's writes in the same Txn: ops are
// applied, together with the new token, only if token is not stale, so no
// newer holder's write can come between the check and them. ops must not
// touch the fence key itself, and a Txn holds at most the server's
// --max-txn-ops operations (128 by default) including the fence's Put.
//
//	err := fence.Apply(ctx, "exports/today", h.Token(), clientv3.OpPut("exports/today", data))
func (f *Fence) Apply(ctx context.Context, key string, token uint64, ops ...clientv3.Op) error {
	if err := backend.CheckStore(ctx, f.st.err, key); err != nil {
		return err
	}
	if token == 0 {
		return fmt.Errorf("etcdlock: %w: %q: token 0 is never issued to a holder", lock.ErrStaleToken, key)
	}
	k, v := f.Key(key), fenceValue(token)
	resp, err := f.st.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.Value(k), ">", v)).
		Then(clientv3.OpGet(k)).
		Else(append([]clientv3.Op{clientv3.OpPut(k, v)}, ops...)...).
		Commit()
	if err != nil {
		return fmt.Errorf("etcdlock: fence: %w", err)
	}
	if !resp.Succeeded {
		return nil
	}
	cur := "a higher token"
	if r := resp.Responses[0].GetResponseRange(); r != nil && len(r.Kvs) > 0 {
		cur = string(r.Kvs[0].Value)
		if n, err := strconv.ParseUint(cur, 10, 64); err == nil {
			cur = strconv.FormatUint(n, 10) // stored zero-padded (fenceValue)
		}
	}
	return fmt.Errorf("etcdlock: %w: %q: token %d is below %s", lock.ErrStaleToken, key, token, cur)
}

// IsDone reports whether key is recorded.
func (l *Ledger) IsDone(ctx context.Context, key string) (bool, error) {
	if err := backend.CheckStore(ctx, l.st.err, key); err != nil {
		return false, err
	}
	resp, err := l.st.cli.Get(ctx, l.Key(key), clientv3.WithCountOnly())
	if err != nil {
		return false, fmt.Errorf("etcdlock: ledger: %w", err)
	}
	return resp.Count > 0, nil
}

// MarkDone records key as done by token, unless it already is: the first
// record wins and a repeated call changes nothing.
func (l *Ledger) MarkDone(ctx context.Context, key string, token uint64) error {
	if err := backend.CheckStore(ctx, l.st.err, key); err != nil {
		return err
	}
	k := l.Key(key)
	_, err := l.st.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(k), "=", 0)).
		Then(clientv3.OpPut(k, fmt.Sprint(token))).
		Commit()
	if err != nil {
		return fmt.Errorf("etcdlock: ledger: %w", err)
	}
	return nil
}
