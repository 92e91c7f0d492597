package etcdlock

import (
	"context"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/ubgo/lock"
)

// Break frees name under the factory's key prefix, whoever holds it: it is
// for an operator whose holder is gone (a crashed or frozen process) while
// its lease still runs. It reads the name's keys and, in one Txn that
// holds only if the holders' keys are still the ones read (else it reads
// again):
//   - deletes the holders' keys: the mutex's, the first n of a semaphore
//     of n, or the readers' of a name held shared (WithShared), never a
//     waiter's nor the holder's lease, which its other locks share;
//   - raises the fence record of the key equal to name (Fence.Key(name),
//     under the same prefix) to one above the highest freed token, unless
//     it is higher already, and creates it if absent: from then on that
//     fence rejects the freed holders' tokens, even before the next holder
//     writes. Fences under other keys learn nothing until the next holder
//     writes through them.
//
// Tokens are revisions, so the next holder's is larger. Waiters are woken
// by their watch as after a release, and the first gets the lock at once.
// A freed holder that is alive sees its key deleted on its own watch at
// once: Done closes and Err matches ErrLockLost.
//
// Break returns an error matching lock.ErrNotHeld when nothing holds name,
// and lock.ErrInvalidName for a bad name. A semaphore with more holders
// than the server's --max-txn-ops allows in one Txn
// cannot be broken: the server's error is returned.
func (f *Factory) Break(ctx context.Context, name string) error {
	if err := lock.ValidateName(name); err != nil {
		return err
	}
	if f.cfg.Err != nil {
		return f.cfg.Err
	}
	q := newQueue(name, &f.cfg.Options)
	fk := (&store{dir: q.prefix + ".fence/"}).key(name)
	for {
		resp, err := f.cli.Get(ctx, q.dir, clientv3.WithPrefix(), clientv3.WithKeysOnly(),
			clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
		if err != nil {
			return fmt.Errorf("etcdlock: break %q: %w", name, err)
		}
		if len(resp.Kvs) == 0 {
			return fmt.Errorf("etcdlock: break: %w: %q", lock.ErrNotHeld, name)
		}
		held := heldOf(q.dir, resp.Kvs)
		var cmps []clientv3.Cmp
		var ops []clientv3.Op
		var top int64
		for _, kv := range held {
			cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(string(kv.Key)), "=", kv.CreateRevision))
			ops = append(ops, clientv3.OpDelete(string(kv.Key)))
			top = max(top, kv.CreateRevision)
		}
		v := fenceValue(uint64(top) + 1)
		ops = append(ops, clientv3.OpTxn(
			[]clientv3.Cmp{clientv3.Compare(clientv3.Value(fk), ">", v)}, nil,
			[]clientv3.Op{clientv3.OpPut(fk, v)}))
		tr, err := f.cli.Txn(ctx).If(cmps...).Then(ops...).Commit()
		if err != nil {
			return fmt.Errorf("etcdlock: break %q: %w", name, err)
		}
		if tr.Succeeded {
			return nil
		}
		// A holder released, or a waiter took its place, since the read.
	}
}
