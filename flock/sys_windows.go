//go:build windows

package flock

import (
	"errors"
	"io/fs"
	"time"

	"golang.org/x/sys/windows"
)

type sysFile = windows.Handle

const noFile sysFile = windows.InvalidHandle

type fileID struct {
	vol       uint32
	high, low uint32
}

// Windows locks are mandatory over the bytes they cover, so the lock sits
// on one byte far beyond the record, which every handle can then still
// read and write.
const lockOffsetHigh = 0x7fffffff

func sysOpen(path string, write, create bool) (sysFile, error) {
	p, err := windows.UTF16PtrFromString(path)
	if err != nil {
		return noFile, &fs.PathError{Op: "open", Path: path, Err: err}
	}
	access := uint32(windows.GENERIC_READ)
	if write {
		access |= windows.GENERIC_WRITE
	}
	mode := uint32(windows.OPEN_EXISTING)
	if create {
		mode = windows.OPEN_ALWAYS
	}
	// FILE_SHARE_DELETE lets a sweeper remove a file that others have open,
	// as on Unix. Handles are not inherited by child processes.
	h, err := windows.CreateFile(p, access,
		windows.FILE_SHARE_READ|windows.FILE_SHARE_WRITE|windows.FILE_SHARE_DELETE,
		nil, mode, windows.FILE_ATTRIBUTE_NORMAL, 0)
	if err != nil {
		return noFile, &fs.PathError{Op: "open", Path: path, Err: err}
	}
	return h, nil
}

// sysClose unlocks first: Windows frees the locks of a closed handle only
// eventually.
func sysClose(h sysFile) {
	windows.UnlockFileEx(h, 0, 1, 0, lockOverlapped())
	windows.CloseHandle(h)
}

func lockOverlapped() *windows.Overlapped { return &windows.Overlapped{OffsetHigh: lockOffsetHigh} }

func sysTryLock(h sysFile, exclusive bool) (bool, error) {
	flags := uint32(windows.LOCKFILE_FAIL_IMMEDIATELY)
	if exclusive {
		flags |= windows.LOCKFILE_EXCLUSIVE_LOCK
	}
	err := windows.LockFileEx(h, flags, 0, 1, 0, lockOverlapped())
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, windows.ERROR_LOCK_VIOLATION), errors.Is(err, windows.ERROR_IO_PENDING):
		return false, nil
	}
	return false, &fs.PathError{Op: "LockFileEx", Err: err}
}

func sysUnlock(h sysFile) error { return windows.UnlockFileEx(h, 0, 1, 0, lockOverlapped()) }

func sysDowngrade(h sysFile) (bool, error) {
	sysUnlock(h)
	return sysTryLock(h, false)
}

func sysPread(h sysFile, b []byte, off int64) (int, error) {
	var n uint32
	ov := &windows.Overlapped{Offset: uint32(off), OffsetHigh: uint32(off >> 32)}
	err := windows.ReadFile(h, b, &n, ov)
	if errors.Is(err, windows.ERROR_HANDLE_EOF) {
		err = nil
	}
	return int(n), err
}

func sysPwrite(h sysFile, b []byte, off int64) error {
	for len(b) > 0 {
		var n uint32
		ov := &windows.Overlapped{Offset: uint32(off), OffsetHigh: uint32(off >> 32)}
		if err := windows.WriteFile(h, b, &n, ov); err != nil {
			return err
		}
		b, off = b[n:], off+int64(n)
	}
	return nil
}

func handleInfo(h sysFile) (fileID, time.Time, error) {
	var fi windows.ByHandleFileInformation
	if err := windows.GetFileInformationByHandle(h, &fi); err != nil {
		return fileID{}, time.Time{}, err
	}
	return fileID{fi.VolumeSerialNumber, fi.FileIndexHigh, fi.FileIndexLow},
		time.Unix(0, fi.LastWriteTime.Nanoseconds()), nil
}

func sysStat(h sysFile) (fileID, time.Time, error) { return handleInfo(h) }

func sysSameFile(h sysFile, path string) (bool, error) {
	id, _, err := handleInfo(h)
	if err != nil {
		return false, err
	}
	p, err := windows.UTF16PtrFromString(path)
	if err != nil {
		return false, err
	}
	o, err := windows.CreateFile(p, 0,
		windows.FILE_SHARE_READ|windows.FILE_SHARE_WRITE|windows.FILE_SHARE_DELETE,
		nil, windows.OPEN_EXISTING, windows.FILE_FLAG_BACKUP_SEMANTICS, 0)
	if err != nil {
		if errors.Is(err, windows.ERROR_FILE_NOT_FOUND) || errors.Is(err, windows.ERROR_ACCESS_DENIED) {
			return false, nil // gone, or pending deletion
		}
		return false, &fs.PathError{Op: "open", Path: path, Err: err}
	}
	defer windows.CloseHandle(o)
	other, _, err := handleInfo(o)
	if err != nil {
		return false, err
	}
	return id == other, nil
}

func sysRemove(path string) error {
	p, err := windows.UTF16PtrFromString(path)
	if err != nil {
		return err
	}
	if err := windows.DeleteFile(p); err != nil && !errors.Is(err, windows.ERROR_FILE_NOT_FOUND) {
		return &fs.PathError{Op: "remove", Path: path, Err: err}
	}
	return nil
}

// sysRetryOpen: a file that is pending deletion (a sweeper removed it while
// another handle was still open) refuses to open with access denied until
// the last handle closes, which is a matter of moments.
func sysRetryOpen(err error) bool { return errors.Is(err, windows.ERROR_ACCESS_DENIED) }
