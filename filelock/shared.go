//go:build unix

package filelock

import (
	"context"
	"fmt"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/backend"
	"github.com/ubgo/lock/internal/dirwatch"
)

// want is the intent marker <esc>.want of an exclusive Acquire that waits
// (WithWait): written at its first look that finds shared holders in its
// way, and rewritten while it waits, so that it lasts one stale window
// past the writer's last look. New shared acquirers stay out while it is
// live (writer preference); other writers do not. A writer that waits for
// another writer writes none: when that one leaves, the readers that
// waited beside it get in together, and a stream of readers after them
// meets the intent. The writer removes it when it takes the name or gives
// up; a writer that died leaves one that is reclaimed like any marker: at
// once on this host, after its lease elsewhere.
//
// An intent is not synced: it means something only while its writer
// lives, and one torn by a crash is judged stale like any marker.
type want struct {
	nonce string    // the intent's, once written
	due   time.Time // when ours is to be rewritten; zero until written
}

// hold makes sure a live intent keeps new readers out, under the name's
// guard: another writer's does as well as ours; ours is rewritten when due.
func (w *want) hold(j *judge, dir, esc string, o *lock.Options) error {
	now := time.Now()
	m, live, _, err := j.examine(wantPath(dir, esc))
	if err != nil {
		return err
	}
	if live && (m == nil || m.Nonce != w.nonce || now.Before(w.due)) {
		return nil
	}
	if w.nonce == "" {
		w.nonce = newNonce()
	}
	ttl := ttlOf(o)
	id := self()
	im := marker{
		Name: j.name, Nonce: w.nonce, PID: id.pid, Start: id.start, StartTicks: id.ticks,
		Host: id.host, BootID: id.bootID, PIDNS: id.pidNS, TimeNS: id.timeNS,
		Acquired: now, Refreshed: now, Expires: now.Add(ttl), StaleAfter: ttl, Limit: 1, Owner: o.Owner,
	}
	tmp := tempPath(dir, esc, newNonce()[:16])
	f, err := createTemp(tmp, im.encode())
	if err != nil {
		return fmt.Errorf("filelock: write intent: %w", err)
	}
	f.Close()
	if err := unix.Rename(tmp, wantPath(dir, esc)); err != nil {
		unix.Unlink(tmp)
		return fmt.Errorf("filelock: write intent: %w", err)
	}
	w.due = now.Add(refreshEvery(ttl))
	return nil
}

// dropLocked removes the intent if it is ours; the caller holds the
// guard. It reports whether it removed one.
func (w *want) dropLocked(dir, esc string) bool {
	if w.nonce == "" {
		return false
	}
	m, _, err := readMarker(wantPath(dir, esc))
	if err != nil || m == nil || m.Nonce != w.nonce {
		return false
	}
	return unix.Unlink(wantPath(dir, esc)) == nil
}

// drop removes the intent of a writer that gave up, if it is still ours,
// and wakes the readers it kept out.
func (w *want) drop(ctx context.Context, dir, esc string) {
	if w.nonce == "" {
		return
	}
	ctx, cancel := backend.ReleaseContext(ctx)
	defer cancel()
	g, err := lockGuard(ctx, dir, esc)
	if err != nil {
		return // it expires with its lease
	}
	removed := w.dropLocked(dir, esc)
	g.unlock()
	if removed {
		dirwatch.Signal(dir, esc)
	}
}
