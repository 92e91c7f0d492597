//go:build unix

package filelock

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/backend"
	"github.com/ubgo/lock/internal/dirwatch"
)

// Break frees name in the factory's directory, whoever holds it: it is for
// an operator whose holder is gone (a frozen process, a host that is down)
// while its stale window still runs; a holder that died on this host is
// taken over at once anyway. In three steps:
//  1. under the name's guard it reads the markers and the token counter:
//     floor is the counter's token, or the highest token in a marker if
//     that is higher (every holder's token is at most floor);
//  2. it raises the fence record of the key equal to name (Fence.Path(name),
//     under the same directory) to floor+1, unless it is higher already, and
//     creates it if absent, under that record's own guard: from then on that
//     fence rejects the holders' tokens, even before the next holder writes.
//     Fences under other keys learn nothing until the next holder writes
//     through them;
//  3. under the name's guard again it removes every live marker whose token
//     is at most floor (a marker taken since step 1 has a larger token and
//     stays) and wakes waiters as a release does.
//
// The counter file stays, so the next holder's token is larger. A freed
// holder that is alive finds its marker gone when it next reads it back
// or refreshes it (see the guide for how often): Done closes and Err
// matches ErrLockLost.
//
// Break returns an error matching lock.ErrNotHeld when nothing holds name,
// and lock.ErrInvalidName for a bad name.
func (f *Factory) Break(ctx context.Context, name string) error {
	if err := lock.ValidateName(name); err != nil {
		return err
	}
	if f.cfg.Err != nil {
		return f.cfg.Err
	}
	dir, err := f.dir(&f.cfg.Options)
	if err != nil {
		return err
	}
	esc := backend.Escape(name)
	floor, err := f.breakMarkers(ctx, dir, esc, name, 0)
	if err != nil {
		return err
	}
	if floor == 0 {
		return fmt.Errorf("filelock: break: %w: %q", lock.ErrNotHeld, name)
	}
	fence := &Fence{st: &store{dir: filepath.Join(dir, "fence")}}
	if err := fence.Apply(ctx, name, floor+1, nil); err != nil && !errors.Is(err, lock.ErrStaleToken) {
		return fmt.Errorf("filelock: break %q: %w", name, err)
	}
	_, err = f.breakMarkers(ctx, dir, esc, name, floor)
	return err
}

// breakMarkers works under the guard of esc. With floor 0 it returns the
// floor of Break's first step, 0 if no marker is live; otherwise it
// removes the live markers whose tokens are at most floor.
func (f *Factory) breakMarkers(ctx context.Context, dir, esc, name string, floor uint64) (uint64, error) {
	g, err := lockGuard(ctx, dir, esc)
	if err != nil {
		return 0, err
	}
	defer g.unlock()
	c := readCounter(g.fd)
	paths, err := namePaths(dir, esc)
	if err != nil {
		return 0, err
	}
	j := &judge{log: backend.Log(&f.cfg.Options), name: name, ttl: ttlOf(&f.cfg.Options), now: time.Now()}
	live, removed := false, 0
	for _, p := range paths {
		m, ok, _, err := j.examine(p)
		if err != nil {
			return 0, err
		}
		switch {
		case !ok:
		case floor == 0:
			live = true
		case m == nil || m.Token <= floor:
			if err := unix.Unlink(p); err != nil && err != unix.ENOENT {
				return 0, fmt.Errorf("filelock: break: remove marker: %w", err)
			}
			removed++
		}
	}
	if removed > 0 || j.reclaimed > 0 {
		dirwatch.Signal(dir, esc)
	}
	if floor != 0 || !live {
		return 0, nil
	}
	floor = j.seen
	if c.valid {
		floor = max(floor, c.token)
	}
	return max(floor, 1), nil
}
