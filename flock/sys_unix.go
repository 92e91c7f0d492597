//go:build unix && !aix && !hurd

package flock

import (
	"io/fs"
	"time"

	"golang.org/x/sys/unix"
)

// sysFile is an open lock file. Each holder and each attempt opens its own:
// flock(2) locks belong to the open file description, so two descriptors
// of one file conflict inside a process as they do between processes.
type sysFile = int

const noFile sysFile = -1

// fileID identifies an inode, to tell whether a descriptor still refers to
// the file at its path.
type fileID struct{ dev, ino uint64 }

func sysOpen(path string, write, create bool) (sysFile, error) {
	flags := unix.O_CLOEXEC // a child started with exec must not inherit a lock
	if write {
		flags |= unix.O_RDWR
	} else {
		flags |= unix.O_RDONLY
	}
	if create {
		flags |= unix.O_CREAT
	}
	for {
		fd, err := unix.Open(path, flags, 0o644)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return noFile, &fs.PathError{Op: "open", Path: path, Err: err}
		}
		return fd, nil
	}
}

func sysClose(fd sysFile) { unix.Close(fd) }

// sysTryLock takes an exclusive or shared lock without blocking; it reports
// false when another open file holds a conflicting lock. Asking for the
// other kind on a descriptor that already holds one converts it, and the
// kernel drops the old lock first: a failed conversion leaves no lock.
func sysTryLock(fd sysFile, exclusive bool) (bool, error) {
	how := unix.LOCK_SH | unix.LOCK_NB
	if exclusive {
		how = unix.LOCK_EX | unix.LOCK_NB
	}
	for {
		switch err := unix.Flock(fd, how); err {
		case nil:
			return true, nil
		case unix.EWOULDBLOCK:
			return false, nil
		case unix.EINTR:
		default:
			return false, &fs.PathError{Op: "flock", Path: "", Err: err}
		}
	}
}

// sysUnlock drops the lock but keeps the descriptor (a sweeper's hold on
// its sweep file); closing it also releases the lock, at once.
func sysUnlock(fd sysFile) error {
	for {
		switch err := unix.Flock(fd, unix.LOCK_UN); err {
		case nil:
			return nil
		case unix.EINTR:
		default:
			return &fs.PathError{Op: "flock", Path: "", Err: err}
		}
	}
}

// sysDowngrade turns an exclusive lock into a shared one. Like flock(2)
// itself it may lose the lock in between; it reports false then.
func sysDowngrade(fd sysFile) (bool, error) { return sysTryLock(fd, false) }

func sysPread(fd sysFile, b []byte, off int64) (int, error) {
	for {
		n, err := unix.Pread(fd, b, off)
		if err != unix.EINTR {
			return n, err
		}
	}
}

func sysPwrite(fd sysFile, b []byte, off int64) error {
	for len(b) > 0 {
		n, err := unix.Pwrite(fd, b, off)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		b, off = b[n:], off+int64(n)
	}
	return nil
}

// sysStat returns the identity and modification time of an open file.
func sysStat(fd sysFile) (fileID, time.Time, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fileID{}, time.Time{}, err
	}
	return fileID{uint64(st.Dev), uint64(st.Ino)}, time.Unix(int64(st.Mtim.Sec), int64(st.Mtim.Nsec)), nil
}

// sysSameFile reports whether fd is still the file linked at path.
func sysSameFile(fd sysFile, path string) (bool, error) {
	id, _, err := sysStat(fd)
	if err != nil {
		return false, err
	}
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		if err == unix.ENOENT {
			return false, nil
		}
		return false, &fs.PathError{Op: "stat", Path: path, Err: err}
	}
	return id == fileID{uint64(st.Dev), uint64(st.Ino)}, nil
}

func sysRemove(path string) error {
	if err := unix.Unlink(path); err != nil && err != unix.ENOENT {
		return &fs.PathError{Op: "unlink", Path: path, Err: err}
	}
	return nil
}

// sysRetryOpen reports whether a failed open is a passing state that a
// retry will clear. On Unix none is.
func sysRetryOpen(error) bool { return false }
