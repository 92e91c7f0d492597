//go:build unix && !linux

package filelock

// watcher reports markers removed from a directory by any process.
type watcher interface{ stop() }

// startWatcher has no directory events to use here: waiters poll.
func startWatcher(string, func(string), func()) watcher { return nil }
