package flock

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"iter"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/backend"
)

// Inspect reports who holds name, from the lock files: the holder's
// token, owner (WithOwner, or pid@host), start time and metadata. It
// takes shared locks for a moment to tell a held file from a free one, so
// an Acquire that does not wait may fail with ErrLocked while it looks.
func (f *Factory) Inspect(ctx context.Context, name string) (lock.Info, error) {
	if err := lock.ValidateName(name); err != nil {
		return lock.Info{}, err
	}
	if f.cfg.Err != nil {
		return lock.Info{}, f.cfg.Err
	}
	dir, err := f.dirOf(&f.cfg.Options)
	if err != nil {
		return lock.Info{}, err
	}
	return inspectEsc(ctx, dir, backend.Escape(name), name)
}

// inspectEsc reads the holders of the name whose escaped form is esc;
// name is "" when the caller knows only esc (List), and the record's
// name is reported.
func inspectEsc(ctx context.Context, dir, esc, name string) (lock.Info, error) {
	c := newCall(dir, esc)
	c.name = name
	for i := 0; ; i++ {
		info, again, err := c.inspect()
		if !again || i >= 20 {
			return info, err
		}
		select {
		case <-ctx.Done():
			return info, ctx.Err()
		case <-time.After(time.Millisecond):
		}
	}
}

// List yields the held names in the factory's directory that start with
// prefix, with their holders as Inspect reports them (and its brief
// shared locks). The order is the directory's, not sorted: the directory
// is read lock.ListPageSize entries at a time, and sorting would need
// every entry at once. A name comes from its lock file's record; a record
// written before List existed has none, and a long (hashed) name among
// those is listed under its escaped file name (backend.ListedName).
// Waiting is 0: waiters are not recorded.
func (f *Factory) List(ctx context.Context, prefix string) iter.Seq2[lock.Info, error] {
	dir := func() (string, error) {
		if f.cfg.Err != nil {
			return "", f.cfg.Err
		}
		return f.dirOf(&f.cfg.Options)
	}
	// A name file is <esc>.lock; esc has no '.', slot files do.
	nameFile := func(file string) (string, bool) {
		esc, ok := strings.CutSuffix(file, ".lock")
		return esc, ok && esc != "" && !strings.Contains(esc, ".")
	}
	return backend.ListDir(ctx, backendName, prefix, dir, nameFile, func(dir, esc string) (lock.Info, error) {
		return inspectEsc(ctx, dir, esc, "")
	})
}

// inspect looks once; again means it met a passing state (a sweep, a
// first member writing the limit) and should look again.
func (c *call) inspect() (info lock.Info, again bool, err error) {
	info.Name = c.name
	// Read-only, so closing it wakes no waiter.
	fd, err := sysOpen(c.namePath, false, false)
	if errors.Is(err, fs.ErrNotExist) {
		return info, false, nil
	}
	if err != nil {
		return info, false, fmt.Errorf("flock: %w", err)
	}
	defer sysClose(fd)
	shared, err := sysTryLock(fd, false)
	if err != nil {
		return info, false, fmt.Errorf("flock: %w", err)
	}
	rec, valid, err := readRecord(fd)
	if err != nil {
		return info, false, fmt.Errorf("flock: %w", err)
	}
	if info.Name == "" && valid { // listing a name known only by its file
		info.Name = rec.name
	}
	if !shared { // an exclusive holder: a mutex, or a moment of a sweep or a first member
		if !valid || rec.dead || rec.limit != 1 {
			return info, true, nil
		}
		info.Limit = 1
		info.Holders = []lock.HolderInfo{holderInfo(rec)}
		return info, false, nil
	}
	if !valid {
		// Free and never written, or caught while a member wrote it.
		return info, fileHasData(fd), nil
	}
	if !rec.dead && rec.limit <= 1 && rec.pid != 0 {
		// Free, or held shared (WithShared): readers keep the exclusive
		// lock out. The latest reader's record stands for them.
		if free, err := sysTryLock(fd, true); err != nil || free {
			return info, false, err
		}
		info.Limit = 1
		info.Holders = []lock.HolderInfo{holderInfo(rec)}
		return info, false, nil
	}
	if rec.dead || rec.limit <= 1 {
		return info, false, nil
	}
	for i := 0; i < rec.limit && i < MaxPermits; i++ {
		sfd, err := sysOpen(c.slotPath(i), false, false)
		if err != nil {
			continue
		}
		if free, err := sysTryLock(sfd, false); err == nil && !free {
			if srec, ok, _ := readRecord(sfd); ok {
				info.Holders = append(info.Holders, holderInfo(srec))
			}
		}
		sysClose(sfd)
	}
	if len(info.Holders) > 0 {
		info.Limit = rec.limit
		sort.Slice(info.Holders, func(i, j int) bool { return info.Holders[i].Token < info.Holders[j].Token })
	}
	return info, false, nil
}

func fileHasData(fd sysFile) bool {
	var b [1]byte
	n, _ := sysPread(fd, b[:], 0)
	return n > 0
}

func holderInfo(r record) lock.HolderInfo {
	hi := lock.HolderInfo{Token: r.token, Owner: r.owner, Metadata: r.meta, Since: r.since}
	if r.pid != 0 {
		hi.ID = strconv.Itoa(r.pid) + "@" + r.host
	}
	return hi
}
