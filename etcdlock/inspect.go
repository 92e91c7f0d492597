package etcdlock

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"iter"
	"slices"
	"sort"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/backend"
)

// Inspect reports the current holders of name under the factory's key
// prefix: token, owner, when the key was written (for a holder that waited,
// when it started waiting), lease expiry and metadata. Waiting counts the
// keys queued behind the holders: the Acquires waiting for the name, and,
// for a moment, one that does not wait and is about to give up.
func (f *Factory) Inspect(ctx context.Context, name string) (lock.Info, error) {
	if err := lock.ValidateName(name); err != nil {
		return lock.Info{}, err
	}
	if f.cfg.Err != nil {
		return lock.Info{}, f.cfg.Err
	}
	q := newQueue(name, &f.cfg.Options)
	resp, err := f.cli.Get(ctx, q.dir, clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	if err != nil {
		return lock.Info{}, err
	}
	return f.infoOf(ctx, name, q.dir, resp.Kvs, map[int64]time.Time{}), nil
}

// heldOf returns the holders' keys of the directory dir, whose keys kvs
// are sorted by create revision: the first limit of them, or the shared
// holders up to the first exclusive key.
func heldOf(dir string, kvs []*mvccpb.KeyValue) []*mvccpb.KeyValue {
	if len(kvs) == 0 {
		return nil
	}
	limit, _ := limitOf(dir, string(kvs[0].Key))
	n := min(max(limit, 1), len(kvs))
	if isShared(string(kvs[0].Key)) {
		for n < len(kvs) && isShared(string(kvs[n].Key)) {
			n++
		}
	}
	return kvs[:n]
}

// infoOf describes the name whose directory dir holds kvs, sorted by
// create revision; expires caches lease expiries.
func (f *Factory) infoOf(ctx context.Context, name, dir string, kvs []*mvccpb.KeyValue, expires map[int64]time.Time) lock.Info {
	info := lock.Info{Name: name}
	if len(kvs) == 0 {
		return info
	}
	info.Limit, _ = limitOf(dir, string(kvs[0].Key))
	held := heldOf(dir, kvs)
	info.Waiting = len(kvs) - len(held)
	for _, kv := range held {
		var r record
		_ = json.Unmarshal(kv.Value, &r)
		hi := lock.HolderInfo{Token: uint64(kv.CreateRevision), Owner: r.Owner, Since: r.Since, Metadata: r.Metadata}
		if hi.Owner == "" {
			hi.Owner = r.Process
		}
		if kv.Lease != 0 {
			exp, ok := expires[kv.Lease]
			if !ok {
				sent := time.Now()
				if ttl, err := f.cli.TimeToLive(ctx, clientv3.LeaseID(kv.Lease)); err == nil && ttl.TTL > 0 {
					exp = sent.Add(time.Duration(ttl.TTL) * time.Second)
				}
				expires[kv.Lease] = exp
			}
			hi.Expires = exp
		}
		info.Holders = append(info.Holders, hi)
	}
	sort.Slice(info.Holders, func(i, j int) bool { return info.Holders[i].Token < info.Holders[j].Token })
	return info
}

// List yields the held names under the factory's key prefix that start
// with prefix, with their holders and waiting counts as Inspect reports
// them, in the byte order of their escaped names (name order for names of
// letters, digits, '-' and '_'). It reads the key range in pages of
// lock.ListPageSize keys, every page at the revision of the first, so the
// listing is one consistent snapshot (a compaction during a long listing
// ends it with an error). Names are recovered from their directories; a
// long name, whose directory is a hash of it, is listed under its escaped
// form (backend.ListedName), and only when prefix fits in that form's
// readable part.
func (f *Factory) List(ctx context.Context, prefix string) iter.Seq2[lock.Info, error] {
	return func(yield func(lock.Info, error) bool) {
		if f.cfg.Err != nil {
			yield(lock.Info{}, f.cfg.Err)
			return
		}
		root := prefixOf(&f.cfg.Options)
		from := root + backend.EscapePrefix(prefix)
		end := rangeEnd(from)
		var (
			rev     int64
			cur     string // the escaped name whose keys are in kvs
			kvs     []*mvccpb.KeyValue
			expires = map[int64]time.Time{}
		)
		// flush yields the name in kvs, if it is listed and held.
		flush := func() bool {
			esc, batch := cur, kvs
			cur, kvs = "", nil
			name, ok := backend.ListedName(esc, prefix)
			if esc == "" || !ok {
				return true
			}
			slices.SortFunc(batch, func(a, b *mvccpb.KeyValue) int { return cmp.Compare(a.CreateRevision, b.CreateRevision) })
			info := f.infoOf(ctx, name, root+esc+"/", batch, expires)
			return len(info.Holders) == 0 || yield(info, nil)
		}
		for key := from; ; {
			opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(lock.ListPageSize)}
			if rev != 0 {
				opts = append(opts, clientv3.WithRev(rev))
			}
			resp, err := f.cli.Get(ctx, key, opts...)
			if err != nil {
				yield(lock.Info{}, fmt.Errorf("etcdlock: list: %w", err))
				return
			}
			if rev == 0 {
				rev = resp.Header.Revision
			}
			clear(expires)
			for _, kv := range resp.Kvs {
				esc, _, ok := strings.Cut(strings.TrimPrefix(string(kv.Key), root), "/")
				if !ok {
					continue
				}
				if esc != cur && !flush() {
					return
				}
				cur = esc
				kvs = append(kvs, kv)
			}
			if !resp.More || len(resp.Kvs) == 0 {
				flush()
				return
			}
			key = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
		}
	}
}
