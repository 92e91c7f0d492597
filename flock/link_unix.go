//go:build unix && !aix && !hurd && !linux

package flock

import "golang.org/x/sys/unix"

// sysLinked reports whether fd's file still has a name: false once it was
// unlinked (by a sweep, rm or a /tmp cleaner) or replaced by a rename over
// it.
func sysLinked(fd sysFile) (bool, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return false, err
	}
	return st.Nlink > 0, nil
}
