//go:build unix && !linux

package filelock

import "golang.org/x/sys/unix"

// datasync flushes a file to disk (no fdatasync here: a full fsync).
func datasync(fd int) error { return unix.Fsync(fd) }
