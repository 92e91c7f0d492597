package flock_test

import (
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// BenchmarkFloorKept is what an acquire+release of a kept descriptor asks
// of the kernel, without the Go side: lock, read the record, check the
// link count, write the record, unlock. AcquireRelease over it is the cost
// of the library itself.
func BenchmarkFloorKept(b *testing.B) {
	path := filepath.Join(b.TempDir(), "floor.lock")
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_CLOEXEC, 0o644)
	if err != nil {
		b.Fatal(err)
	}
	defer unix.Close(fd)
	buf := make([]byte, 512)
	rec := []byte("counter 1764480000000000001\n")
	b.ReportAllocs()
	defer cpuPerOp(b)()
	for b.Loop() {
		if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
			b.Fatal(err)
		}
		if _, err := unix.Pread(fd, buf, 0); err != nil {
			b.Fatal(err)
		}
		var st unix.Statx_t
		if err := unix.Statx(fd, "", unix.AT_EMPTY_PATH, unix.STATX_NLINK, &st); err != nil {
			b.Fatal(err)
		}
		rec[len(rec)-2]++ // a new token each time
		if _, err := unix.Pwrite(fd, rec, 0); err != nil {
			b.Fatal(err)
		}
		if err := unix.Flock(fd, unix.LOCK_UN); err != nil {
			b.Fatal(err)
		}
	}
}
