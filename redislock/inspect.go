package redislock

import (
	"context"
	"encoding/json"
	"fmt"
	"iter"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/ubgo/lock"
	"github.com/ubgo/lock/backend"
)

// Inspect reports the current holders of name under the factory's key
// prefix: for each, its token, owner, metadata, when it was acquired (server
// clock) and when its lease ends.
func (f *Factory) Inspect(ctx context.Context, name string) (lock.Info, error) {
	o, err := f.resolve(name, nil)
	if err != nil {
		return lock.Info{}, err
	}
	k := keysFor(o.KeyPrefix, name)
	res, err := inspectScript.Run(ctx, f.c, k.inspected()).Slice()
	if err != nil {
		return lock.Info{Name: name}, fmt.Errorf("redislock: inspect: %w", err)
	}
	return parseInspect(name, res, time.Now()), nil
}

// inspected is the keys lua/inspect.lua reads.
func (k keys) inspected() []string { return []string{k.lock, k.permits, k.queue} }

// parseInspect reads the inspect script's reply.
func parseInspect(name string, res []any, now time.Time) lock.Info {
	info := lock.Info{Name: name}
	if len(res) < 2 {
		return info
	}
	if kind, _ := res[0].(string); kind == "m" && len(res) == 4 {
		// A mutex: "id:token:since:meta", then its flags (see
		// lua/mutex_acquire.lua); the queue's length.
		info.Limit = 1
		v, _ := res[1].(string)
		ms, _ := toInt(res[2])
		n, _ := toInt(res[3])
		info.Waiting = int(n)
		v, _, _ = strings.Cut(v, "\n")
		parts := strings.SplitN(v, ":", 4)
		if len(parts) == 4 {
			info.Holders = append(info.Holders, holderInfo(parts[1], parts[2], parts[3], ms, now))
		}
		return info
	}
	lim, _ := toInt(res[0])
	n, _ := toInt(res[1])
	info.Limit, info.Waiting = int(lim), int(n)
	for i := 2; i+2 < len(res); i += 3 {
		v, _ := res[i+1].(string)
		ms, _ := toInt(res[i+2])
		parts := strings.SplitN(v, ":", 3)
		if len(parts) == 3 {
			info.Holders = append(info.Holders, holderInfo(parts[0], parts[1], parts[2], ms, now))
		}
	}
	sort.Slice(info.Holders, func(i, j int) bool { return info.Holders[i].Token < info.Holders[j].Token })
	return info
}

// List yields the held names under the factory's key prefix that start
// with prefix, with their holders as Inspect reports them. It SCANs for
// the names' lock keys (<key prefix>{<escaped name>}:lock, whatever holds
// the name), lock.ListPageSize at a time, on every master of a
// cluster or shard of a ring, and reads each page's holders in one
// pipeline. The order is SCAN's, not sorted, and SCAN may return a key
// twice while Redis resizes its table, so a name may, rarely, be listed
// twice. Names are recovered from their keys; a long name, whose key
// holds a hash of it, is listed under its escaped form
// (backend.ListedName), and only when prefix fits in that form's
// readable part. Waiting counts the waiters queued for a mutex, or the
// writers waiting for a shared name's readers (0 for a semaphore: not
// counted).
func (f *Factory) List(ctx context.Context, prefix string) iter.Seq2[lock.Info, error] {
	return func(yield func(lock.Info, error) bool) {
		kp := f.cfg.Options.KeyPrefix
		if kp == "" {
			kp = DefaultKeyPrefix
		}
		if f.cfg.Err != nil {
			yield(lock.Info{}, f.cfg.Err)
			return
		}
		nodes, err := f.scanners(ctx)
		if err != nil {
			yield(lock.Info{}, err)
			return
		}
		match := globQuote(kp+"{"+backend.EscapePrefix(prefix)) + "*"
		for _, node := range nodes {
			for cursor := uint64(0); ; {
				page, next, err := node.Scan(ctx, cursor, match, lock.ListPageSize).Result()
				if err != nil {
					yield(lock.Info{}, fmt.Errorf("redislock: list: %w", err))
					return
				}
				infos, err := f.listPage(ctx, kp, prefix, page)
				if err != nil {
					yield(lock.Info{}, err)
					return
				}
				for _, info := range infos {
					if !yield(info, nil) {
						return
					}
				}
				if cursor = next; cursor == 0 {
					break
				}
			}
		}
	}
}

// listPage inspects the names whose lock keys are among page.
func (f *Factory) listPage(ctx context.Context, kp, prefix string, page []string) ([]lock.Info, error) {
	type found struct{ name, esc string }
	var names []found
	for _, key := range page {
		rest, ok := strings.CutPrefix(key, kp+"{")
		if !ok {
			continue
		}
		esc, kind, ok := strings.Cut(rest, "}:")
		if !ok || kind != "lock" {
			continue
		}
		name, ok := backend.ListedName(esc, prefix)
		if ok {
			names = append(names, found{name, esc})
		}
	}
	if len(names) == 0 {
		return nil, nil
	}
	cmds := pipeScripts(ctx, f.c, len(names), func(i int) (*redis.Script, []string, []any) {
		return inspectScript, keysOfEscaped(kp, names[i].esc).inspected(), nil
	})
	now := time.Now()
	var infos []lock.Info
	for i, cmd := range cmds {
		res, err := cmd.Slice()
		if err != nil && err != redis.Nil {
			return nil, fmt.Errorf("redislock: list: %w", err)
		}
		info := parseInspect(names[i].name, res, now)
		if len(info.Holders) == 0 {
			continue
		}
		infos = append(infos, info)
	}
	return infos, nil
}

// scanner is a client that can SCAN one server.
type scanner interface {
	Scan(ctx context.Context, cursor uint64, match string, count int64) *redis.ScanCmd
}

// scanners returns a client of every server that holds keys: each master
// of a cluster, each shard of a ring, or the client itself.
func (f *Factory) scanners(ctx context.Context) ([]scanner, error) {
	var mu sync.Mutex
	var nodes []scanner
	collect := func(_ context.Context, c *redis.Client) error {
		mu.Lock()
		nodes = append(nodes, c)
		mu.Unlock()
		return nil
	}
	var err error
	switch c := f.c.(type) {
	case *redis.ClusterClient:
		err = c.ForEachMaster(ctx, collect)
	case *redis.Ring:
		err = c.ForEachShard(ctx, collect)
	case scanner:
		nodes = append(nodes, c)
	default:
		err = fmt.Errorf("%w: List needs a client that can SCAN, not %T", lock.ErrInvalidOption, f.c)
	}
	if err != nil {
		return nil, fmt.Errorf("redislock: list: %w", err)
	}
	return nodes, nil
}

// globQuote quotes s for a SCAN MATCH pattern.
func globQuote(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '*', '?', '[', ']', '\\':
			b.WriteByte('\\')
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func holderInfo(tok, since, m string, msLeft int64, now time.Time) lock.HolderInfo {
	hi := lock.HolderInfo{}
	hi.Token, _ = strconv.ParseUint(tok, 10, 64)
	if ms, err := strconv.ParseInt(since, 10, 64); err == nil {
		hi.Since = time.UnixMilli(ms)
	}
	if msLeft >= 0 {
		hi.Expires = now.Add(time.Duration(msLeft) * time.Millisecond)
	}
	var md meta
	if json.Unmarshal([]byte(m), &md) == nil {
		hi.Owner, hi.Metadata = md.Owner, md.Metadata
	}
	return hi
}
