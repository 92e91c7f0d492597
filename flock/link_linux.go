//go:build linux

package flock

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// emptyPath is statx's "" path, passed without unix.Statx's allocation.
var emptyPath = [1]byte{}

// sysLinked reports whether fd's file still has a name: false once it was
// unlinked (by a sweep, rm or a /tmp cleaner) or replaced by a rename over
// it. It asks statx for the link count alone: a stat that reads the
// modification time makes the kernel (6.13 on, multigrain timestamps)
// give the next write a fine-grained time, and so a journalled inode
// update, which costs more than the stat itself.
func sysLinked(fd sysFile) (bool, error) {
	var st unix.Statx_t
	for {
		_, _, errno := unix.Syscall6(unix.SYS_STATX, uintptr(fd), uintptr(unsafe.Pointer(&emptyPath[0])),
			unix.AT_EMPTY_PATH, unix.STATX_NLINK, uintptr(unsafe.Pointer(&st)), 0)
		switch errno {
		case 0:
			return st.Nlink > 0, nil
		case unix.EINTR:
			continue
		}
		return false, errno
	}
}
