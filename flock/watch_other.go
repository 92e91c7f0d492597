//go:build !linux

package flock

// watchDir reports that no file events are available: waiters poll.
func watchDir(string) (stop func(), ok bool) { return func() {}, false }
