package flock

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ubgo/lock/backend"
	"github.com/ubgo/lock/internal/dirwatch"
)

// Sweep removes the files of every name in the factory's directory that
// nobody holds and whose lock file was last written (by an acquire) at
// least idle ago, and returns how many names it removed. Files that are
// not this package's are left alone.
//
// For each name it takes the exclusive lock of <esc>.lock (so nobody holds
// a permit or the mutex, and nobody can until it lets go), checks that the
// file is still the one at the path (not removed by another sweep since the
// listing, its name's other files perhaps a new generation's), raises the
// directory's fence file (ubgo-flock.fence) past the name's token counter,
// writes "dead 1" into the file, unlinks the slot and guard files and then
// the lock file, and only then closes it. An acquirer that opened the old
// file and locks it afterwards finds it dead and opens the path again, so
// no two processes ever hold two different files of one name; the name's
// next counter starts above the fence.
//
// While it holds a name's lock file the sweeper also holds the exclusive
// lock of the directory's ubgo-flock.sweep, so an Acquire without WithWait
// that finds a name busy can tell a sweep from a holder: it waits for the
// sweep to let go and tries again instead of reporting ErrLocked for a
// name nobody holds.
func (f *Factory) Sweep(ctx context.Context, idle time.Duration) (int, error) {
	if f.cfg.Err != nil {
		return 0, f.cfg.Err
	}
	dir, err := f.dirOf(&f.cfg.Options)
	if err != nil {
		return 0, err
	}
	return sweepDir(ctx, dir, idle)
}

// sweeps records, per directory, when this process may sweep it next.
var sweeps = struct {
	sync.Mutex
	next map[string]time.Time
}{next: map[string]time.Time{}}

// autoSweep starts a background sweep of dir, with WithSweepAfter(d), if
// none ran in this process within the last d.
func (f *Factory) autoSweep(dir string, d time.Duration) {
	if d <= 0 {
		return
	}
	now := time.Now()
	sweeps.Lock()
	due := !now.Before(sweeps.next[dir])
	if due {
		sweeps.next[dir] = now.Add(d)
	}
	sweeps.Unlock()
	if !due {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return
	}
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		n, err := sweepDir(f.ctx, dir, d)
		if err != nil || n > 0 {
			log := backend.Log(&f.cfg.Options).Debug
			if err != nil && !errors.Is(err, context.Canceled) {
				log = backend.Log(&f.cfg.Options).Warn
			}
			log("flock: swept lock directory", "dir", dir, "removed", n, "err", err)
		}
	}()
}

// nameFiles are the files of one name Sweep may remove.
type nameFiles struct {
	hasLock bool
	newest  time.Time
	others  []string // slot and guard files seen in the listing
}

func sweepDir(ctx context.Context, dir string, idle time.Duration) (int, error) {
	names, err := sweepList(dir)
	if err != nil {
		return 0, err
	}
	removed := 0
	var errs []error
	mark := noFile // the directory's sweepFile
	defer func() {
		if mark != noFile {
			sysClose(mark)
		}
	}()
	for _, esc := range slices.Sorted(maps.Keys(names)) {
		if err := ctx.Err(); err != nil {
			return removed, err
		}
		n := names[esc]
		if time.Since(n.newest) < idle {
			continue
		}
		if mark == noFile {
			if mark, err = sysOpen(filepath.Join(dir, sweepFile), true, true); err != nil {
				mark = noFile
				return removed, fmt.Errorf("flock: %w", err)
			}
		}
		if err := lockSpin(ctx, mark, true); err != nil {
			return removed, err
		}
		ok, err := sweepName(dir, esc, n, idle)
		sysUnlock(mark)
		if err != nil {
			errs = append(errs, err)
		}
		if ok {
			removed++
		}
	}
	return removed, errors.Join(errs...)
}

// sweepList lists the directory's nameFiles by escaped name.
func sweepList(dir string) (map[string]*nameFiles, error) {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("flock: %w", err)
	}
	names := map[string]*nameFiles{}
	for _, e := range ents {
		if !e.Type().IsRegular() {
			continue
		}
		file := e.Name()
		esc, kind, ok := splitFile(file)
		if !ok {
			continue
		}
		info, err := e.Info()
		if err != nil {
			continue // removed since the listing
		}
		n := names[esc]
		if n == nil {
			n = &nameFiles{}
			names[esc] = n
		}
		if kind == "lock" {
			n.hasLock = true
		} else {
			n.others = append(n.others, file)
		}
		if t := info.ModTime(); t.After(n.newest) {
			n.newest = t
		}
	}
	return names, nil
}

// fenceFile is the directory's high-water mark: no smaller than the last
// token of any name swept from it. It is not a name's file: every name's
// file ends in .lock or .guard.
const fenceFile = "ubgo-flock.fence"

// sweepFile is locked exclusively by a sweeper for as long as it holds a
// name's lock file (see Factory.Sweep). Like the fence it is no name's file.
const sweepFile = "ubgo-flock.sweep"

// sweepRetries bounds how often an Acquire without WithWait tries again
// after a sweep.
const sweepRetries = 3

// afterSweep reports whether a busy name is worth another try: whether
// sweeps run in dir, in which case it returns once none holds a name's
// file, so a sweep that held the name at the failed try has let go. It
// waits at most a second for a sweeper that is stopped.
func afterSweep(ctx context.Context, dir string) bool {
	fd, err := sysOpen(filepath.Join(dir, sweepFile), false, false)
	if err != nil {
		return false // no sweep ever ran here
	}
	defer sysClose(fd)
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	return lockSpin(ctx, fd, false) == nil
}

// readFence returns the directory's fence, 0 when there is none (or it is
// damaged: the clock then decides alone).
func readFence(ctx context.Context, dir string) (uint64, error) {
	fd, err := sysOpen(filepath.Join(dir, fenceFile), false, false)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("flock: %w", err)
	}
	defer sysClose(fd)
	if err := lockSpin(ctx, fd, false); err != nil {
		return 0, err
	}
	rec, valid, err := readCounter(fd)
	if err != nil {
		return 0, fmt.Errorf("flock: reading %s: %w", fenceFile, err)
	}
	if !valid {
		return 0, nil
	}
	return rec.token, nil
}

// raiseFence makes the directory's fence at least token.
func raiseFence(dir string, token uint64) error {
	fd, err := sysOpen(filepath.Join(dir, fenceFile), true, true)
	if err != nil {
		return fmt.Errorf("flock: %w", err)
	}
	defer sysClose(fd)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := lockSpin(ctx, fd, true); err != nil {
		return err
	}
	rec, valid, err := readCounter(fd)
	if err != nil {
		return fmt.Errorf("flock: reading %s: %w", fenceFile, err)
	}
	if valid && rec.token >= token {
		return nil
	}
	return writeRecord(fd, &record{token: token})
}

// splitFile classifies a directory entry: "<esc>.lock" is "lock",
// "<esc>.<i>.lock" is "slot", "<esc>.guard" is "guard". An escaped name
// contains no '.'.
func splitFile(file string) (esc, kind string, ok bool) {
	esc, rest, found := strings.Cut(file, ".")
	switch {
	case !found || esc == "":
		return "", "", false
	case rest == "lock":
		return esc, "lock", true
	case rest == "guard":
		return esc, "guard", true
	case rest == "want":
		return esc, "want", true
	}
	if n, ok := strings.CutSuffix(rest, ".lock"); ok && n != "" && strings.Trim(n, "0123456789") == "" {
		return esc, "slot", true
	}
	return "", "", false
}

func sweepName(dir, esc string, n *nameFiles, idle time.Duration) (bool, error) {
	c := newCall(dir, esc)
	// Leftover slot or guard files without a lock file are removed under
	// a lock file made for the purpose, by the same protocol.
	fd, err := sysOpen(c.namePath, true, !n.hasLock)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("flock: %w", err)
	}
	defer dirwatch.Signal(dir, esc)
	defer sysClose(fd)
	return removeName(c, fd, n, idle)
}

// removeName removes the name's files if fd, its lock file as opened after
// the listing, is still the name's, free and idle.
func removeName(c *call, fd sysFile, n *nameFiles, idle time.Duration) (bool, error) {
	dir, esc := c.dir, c.esc
	ok, err := sysTryLock(fd, true)
	if err != nil || !ok {
		return false, err
	}
	// Only the exclusive lock of the file at the path keeps the name's
	// other files (slots, guard) out of use. A file that another sweeper
	// unlinked since the listing guards nothing: the files at the name's
	// paths may be a new generation's, held by permit holders, and
	// removing them would let a second holder into a slot.
	if same, err := sysSameFile(fd, c.namePath); err != nil || !same {
		return false, err
	}
	rec, valid, err := readCounter(fd)
	if err != nil {
		return false, fmt.Errorf("flock: %w", err)
	}
	if valid && !rec.dead {
		// Used since the listing? The lock file is written on every
		// acquire.
		if _, mtime, err := sysStat(fd); err != nil || time.Since(mtime) < idle {
			return false, err
		}
	}
	if valid && rec.token > 0 {
		// Before the counter goes, the directory's fence must be past
		// it: a new file of this name starts above the fence.
		if err := raiseFence(dir, rec.token); err != nil {
			return false, err
		}
	}
	if valid {
		rec = record{dead: true, token: rec.token, limit: rec.limit}
	} else {
		rec = record{dead: true}
	}
	if err := writeRecord(fd, &rec); err != nil {
		return false, err
	}
	var errs []error
	files := slices.Clone(n.others)
	for i := 0; i < rec.limit && i < MaxPermits; i++ {
		files = append(files, c.slotPath(i)[len(dir)+1:])
	}
	files = append(files, esc+".guard", esc+".want")
	for _, file := range files {
		if err := sysRemove(filepath.Join(dir, file)); err != nil {
			errs = append(errs, err)
		}
	}
	if err := sysRemove(c.namePath); err != nil {
		errs = append(errs, err)
	}
	return true, errors.Join(errs...)
}
