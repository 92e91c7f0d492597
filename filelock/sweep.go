//go:build unix

package filelock

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ubgo/lock/backend"
	"github.com/ubgo/lock/internal/dirwatch"
)

// tempAge is the youngest temporary file Sweep removes: a writer needs one
// for milliseconds, so one older was left by a writer that died.
const tempAge = time.Minute

// Sweep removes what no holder uses and was last written at least idle
// ago, in the factory's directory, under each name's guard, so it never
// races an Acquire, a refresh or a Release:
//   - markers that are provably stale (their holder died on this host, or
//     their lease ran out) and the intents of waiting writers stale the
//     same way; a marker is last written by its last refresh;
//   - temporary files of writers that crashed, once older than idle and
//     than a minute.
//
// With idle 0 every stale marker goes, as the next Acquire of its name
// would take it over; a larger idle leaves a dead holder's marker for
// people to read. The names' .token files stay: they keep the next token
// above the last. Sweep returns how many markers it removed. Acquire
// reclaims stale markers of the names it takes by itself; Sweep is for
// tidying names nobody asks for any more.
func (f *Factory) Sweep(ctx context.Context, idle time.Duration) (int, error) {
	if f.cfg.Err != nil {
		return 0, f.cfg.Err
	}
	dir, err := f.dir(&f.cfg.Options)
	if err != nil {
		return 0, err
	}
	names, err := sweepList(dir)
	if err != nil {
		return 0, err
	}
	n := 0
	var errs []error
	for _, esc := range slices.Sorted(maps.Keys(names)) {
		if err := ctx.Err(); err != nil {
			return n, err
		}
		removed, err := f.sweepName(ctx, dir, esc, names[esc], idle)
		n += removed
		if err != nil {
			errs = append(errs, err)
		}
	}
	return n, errors.Join(errs...)
}

// sweepFiles are the files of one name Sweep may remove.
type sweepFiles struct {
	markers []string // holders' markers and waiting writers' intents
	temps   []string
}

// sweepList lists the directory's sweepFiles by escaped name.
func sweepList(dir string) (map[string]*sweepFiles, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil // removed since first use: nothing to sweep
	}
	if err != nil {
		return nil, fmt.Errorf("filelock: %w", err)
	}
	names := map[string]*sweepFiles{}
	for _, e := range entries {
		esc, kind := classify(e.Name())
		if kind != kindMarker && kind != kindWant && kind != kindTemp {
			continue
		}
		fs := names[esc]
		if fs == nil {
			fs = &sweepFiles{}
			names[esc] = fs
		}
		p := filepath.Join(dir, e.Name())
		if kind != kindTemp {
			fs.markers = append(fs.markers, p)
		} else {
			fs.temps = append(fs.temps, p)
		}
	}
	return names, nil
}

// sweepName sweeps the files of esc under its guard, and wakes its waiters
// when it removed a marker.
func (f *Factory) sweepName(ctx context.Context, dir, esc string, fs *sweepFiles, idle time.Duration) (int, error) {
	g, err := lockGuard(ctx, dir, esc)
	if err != nil {
		return 0, err
	}
	j := &judge{log: backend.Log(&f.cfg.Options), name: esc, ttl: ttlOf(&f.cfg.Options), now: time.Now(), idle: idle}
	var errs []error
	for _, p := range fs.markers {
		if _, _, _, err := j.examine(p); err != nil {
			errs = append(errs, err)
		}
	}
	for _, p := range fs.temps {
		if st, err := os.Lstat(p); err != nil || time.Since(st.ModTime()) < max(idle, tempAge) {
			continue
		}
		if err := unix.Unlink(p); err != nil && err != unix.ENOENT {
			errs = append(errs, fmt.Errorf("filelock: remove %s: %w", p, err))
		}
	}
	g.unlock()
	if j.reclaimed > 0 {
		dirwatch.Signal(dir, esc)
	}
	return j.reclaimed, errors.Join(errs...)
}
