//go:build unix

package filelock

import (
	"context"
	"errors"
	"fmt"
	"github.com/ubgo/lock/backend"
	"github.com/ubgo/lock/internal/dirwatch"
	"golang.org/x/sys/unix"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"time"
)

// tempAge is the age after which Sweep removes a temporary file.
const tempAge = time.Minute

// Sweep removes the markers in the factory's directory that are provably
// stale — their holder died on this host, or their lease ran out —, the
// intents of waiting writers that are stale the same way, and the
// stale temporary files of writers that crashed. It takes each name's
// guard, so it never races an Acquire, a refresh or a Release. It returns
// how many markers it removed. Acquire reclaims stale markers of the names it takes by
// itself; Sweep is for tidying names nobody asks for any more.
func (f *Factory) Sweep(ctx context.Context) (int, error) {
	if f.cfg.Err != nil {
		return 0, f.cfg.Err
	}
	dir, err := f.dir(&f.cfg.Options)
	if err != nil {
		return 0, err
	}
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil // removed since first use: nothing to sweep
	}
	if err != nil {
		return 0, fmt.Errorf("filelock: %w", err)
	}
	type files struct{ markers, temps []string }
	byName := map[string]*files{}
	for _, e := range entries {
		esc, kind := classify(e.Name())
		if kind != kindMarker && kind != kindWant && kind != kindTemp {
			continue
		}
		fs := byName[esc]
		if fs == nil {
			fs = &files{}
			byName[esc] = fs
		}
		p := filepath.Join(dir, e.Name())
		if kind != kindTemp { // a holder's marker or a waiting writer's intent
			fs.markers = append(fs.markers, p)
		} else {
			fs.temps = append(fs.temps, p)
		}
	}
	n := 0
	var errs []error
	for _, esc := range slices.Sorted(maps.Keys(byName)) {
		if err := ctx.Err(); err != nil {
			return n, err
		}
		fs := byName[esc]
		g, err := lockGuard(ctx, dir, esc)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		j := &judge{log: backend.Log(&f.cfg.Options), name: esc, ttl: ttlOf(&f.cfg.Options), now: time.Now()}
		for _, p := range fs.markers {
			if _, _, _, err := j.examine(p); err != nil {
				errs = append(errs, err)
			}
		}
		// A writer needs its temporary file for milliseconds; one older
		// than tempAge was left by a writer that died.
		for _, p := range fs.temps {
			if st, err := os.Lstat(p); err != nil || time.Since(st.ModTime()) < tempAge {
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
		n += j.reclaimed
	}
	return n, errors.Join(errs...)
}
