//go:build unix

package filelock

import (
	"context"
	"fmt"
	"github.com/ubgo/lock"
	"github.com/ubgo/lock/backend"
	"iter"
	"maps"
	"sort"
	"time"
)

// Inspect reports the live holders of name in the factory's directory,
// reading markers without changing anything. ID is "pid@host", Owner the
// WithOwner value, Metadata the WithMetadata pairs.
func (f *Factory) Inspect(ctx context.Context, name string) (lock.Info, error) {
	if err := lock.ValidateName(name); err != nil {
		return lock.Info{}, err
	}
	if f.cfg.Err != nil {
		return lock.Info{}, f.cfg.Err
	}
	if err := ctx.Err(); err != nil {
		return lock.Info{}, err
	}
	dir, err := f.dir(&f.cfg.Options)
	if err != nil {
		return lock.Info{Name: name}, err
	}
	return f.inspectEsc(dir, backend.Escape(name), name)
}

// inspectEsc reads the live holders of the name whose escaped form is
// esc; name is "" when the caller knows only esc (List), and the name in
// the markers is reported.
func (f *Factory) inspectEsc(dir, esc, name string) (lock.Info, error) {
	info := lock.Info{Name: name}
	paths, err := namePaths(dir, esc)
	if err != nil {
		return info, err
	}
	j := &judge{name: name, ttl: ttlOf(&f.cfg.Options), now: time.Now(), inspect: true}
	for _, p := range paths {
		m, live, expires, err := j.examine(p)
		if err != nil {
			return info, err
		}
		if !live {
			continue
		}
		hi := lock.HolderInfo{Expires: expires}
		limit := 0
		if m != nil {
			hi.Token, hi.ID, hi.Owner, hi.Since, limit = m.Token, fmt.Sprintf("%d@%s", m.PID, m.Host), m.Owner, m.Acquired, m.Limit
			hi.Metadata = maps.Clone(m.Meta)
			if info.Name == "" {
				info.Name = m.Name
			}
		}
		info.Limit = max(info.Limit, limit, 1)
		info.Holders = append(info.Holders, hi)
	}
	sort.Slice(info.Holders, func(i, k int) bool { return info.Holders[i].Token < info.Holders[k].Token })
	return info, nil
}

// List yields the held names in the factory's directory that start with
// prefix, with their live holders as Inspect reports them. The order is
// the directory's, not sorted: the directory is read lock.ListPageSize
// entries at a time, and sorting would need every entry at once. Each
// name is found by its counter file (<esc>.token, which every name that
// was ever taken has) and reported with the name its markers record.
// Waiting is 0: waiters are not recorded.
func (f *Factory) List(ctx context.Context, prefix string) iter.Seq2[lock.Info, error] {
	dir := func() (string, error) {
		if f.cfg.Err != nil {
			return "", f.cfg.Err
		}
		return f.dir(&f.cfg.Options)
	}
	counter := func(file string) (string, bool) {
		esc, kind := classify(file)
		return esc, kind == kindCounter
	}
	return backend.ListDir(ctx, backendName, prefix, dir, counter, func(dir, esc string) (lock.Info, error) {
		return f.inspectEsc(dir, esc, "")
	})
}
