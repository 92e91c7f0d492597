package filelock

import "golang.org/x/sys/unix"

// datasync flushes a file's data, and its size if it changed, to disk.
func datasync(fd int) error { return unix.Fdatasync(fd) }
