//go:build unix

package filelock

import (
	"errors"
	"fmt"
	"golang.org/x/sys/unix"
	"log/slog"
	"time"
)

// judge decides whether markers are live, removing stale ones unless it
// only inspects.
type judge struct {
	log       *slog.Logger
	name      string
	ttl       time.Duration // for markers too damaged to say their own lease
	now       time.Time
	inspect   bool          // never remove
	idle      time.Duration // leave stale markers written less than idle ago (Sweep)
	seen      uint64        // highest token seen
	reclaimed int
}

// examine reads the marker at path. live reports whether it still holds;
// expires is when its lease runs out. A stale marker is removed (we hold the
// name's guard, so nobody else is judging or replacing it meanwhile).
func (j *judge) examine(path string) (m *marker, live bool, expires time.Time, err error) {
	m, mtime, err := readMarker(path)
	if errors.Is(err, unix.ENOENT) {
		return nil, false, time.Time{}, nil
	}
	if err != nil {
		return nil, false, time.Time{}, fmt.Errorf("filelock: read marker: %w", err)
	}
	var reason string
	if m == nil {
		expires = mtime.Add(j.ttl)
		if j.now.After(expires) {
			reason = "unreadable marker older than the stale window"
		}
	} else {
		expires = m.Expires
		j.seen = max(j.seen, m.Token)
		switch {
		case j.now.After(m.Expires):
			reason = "stale window passed without a refresh"
		case holderGone(m):
			reason = "holder process is gone"
		}
	}
	if reason == "" {
		return m, true, expires, nil
	}
	if j.inspect || j.idle > 0 && j.now.Sub(mtime) < j.idle {
		return m, false, expires, nil
	}
	if err := unix.Unlink(path); err != nil && err != unix.ENOENT {
		return nil, false, time.Time{}, fmt.Errorf("filelock: remove stale marker: %w", err)
	}
	j.reclaimed++
	attrs := []any{slog.String("backend", backendName), slog.String("name", j.name), slog.String("file", path), slog.String("reason", reason)}
	if m != nil {
		attrs = append(attrs, slog.Int("pid", m.PID), slog.String("host", m.Host), slog.Uint64("token", m.Token))
	}
	j.log.Info("filelock: reclaimed stale marker", attrs...)
	return m, false, expires, nil
}
