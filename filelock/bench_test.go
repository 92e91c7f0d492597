//go:build unix

package filelock_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ubgo/lock/filelock"
	"github.com/ubgo/lock/internal/testenv"
)

// BenchmarkAcquireRelease is one uncontended Acquire and Release: guard
// flock, counter write (not flushed), marker written and fsynced, link(2),
// then guard, read back and unlink on release.
func BenchmarkAcquireRelease(b *testing.B) {
	f := filelock.NewFactory(filelock.WithDir(b.TempDir()), filelock.WithLogger(nil))
	defer f.Close()
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		h, err := f.Acquire(ctx, "bench")
		if err != nil {
			b.Fatal(err)
		}
		h.Release()
	}
}

// BenchmarkFloorCreateRemove is the least a marker-file lock can do in the
// same directory: create a file exclusively, then remove it.
func BenchmarkFloorCreateRemove(b *testing.B) {
	path := filepath.Join(b.TempDir(), "floor.lock")
	for b.Loop() {
		fd, err := unix.Open(path, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, 0o644)
		if err != nil {
			b.Fatal(err)
		}
		unix.Close(fd)
		unix.Unlink(path)
	}
}

// BenchmarkFloorDurable is the floor for a marker that is durable and
// appears whole: write a temporary file, fsync it, link it into place,
// remove the temporary name, and remove the marker.
func BenchmarkFloorDurable(b *testing.B) {
	dir := b.TempDir()
	tmp, path := filepath.Join(dir, "floor.tmp"), filepath.Join(dir, "floor.lock")
	data := make([]byte, 400) // about the size of a marker
	for b.Loop() {
		fd, err := unix.Open(tmp, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, 0o644)
		if err != nil {
			b.Fatal(err)
		}
		unix.Write(fd, data)
		unix.Fsync(fd)
		unix.Close(fd)
		if err := unix.Link(tmp, path); err != nil {
			b.Fatal(err)
		}
		unix.Unlink(tmp)
		unix.Unlink(path)
	}
}

// BenchmarkHandoff measures the time from a Release to the Acquire of a
// waiter (another factory, as another process would be) returning.
func BenchmarkHandoff(b *testing.B) {
	dir := b.TempDir()
	f1 := filelock.NewFactory(filelock.WithDir(dir), filelock.WithLogger(nil))
	f2 := filelock.NewFactory(filelock.WithDir(dir), filelock.WithLogger(nil))
	defer f1.Close()
	defer f2.Close()
	ctx := context.Background()
	var total time.Duration
	for i := 0; i < b.N; i++ {
		h, err := f1.Acquire(ctx, "pp")
		if err != nil {
			b.Fatal(err)
		}
		got := make(chan *filelock.Holder)
		go func() {
			w, err := f2.Acquire(ctx, "pp", filelock.WithWait())
			if err != nil {
				b.Error(err)
			}
			got <- w
		}()
		testenv.Eventually(b, 10*time.Second, "the waiter waiting", func() bool { return filelock.Waiting(dir, "pp") > 0 })
		start := time.Now()
		h.Release()
		w := <-got
		total += time.Since(start)
		w.Release()
	}
	b.ReportMetric(float64(total.Nanoseconds())/float64(b.N), "ns/handoff")
}

// BenchmarkVsFloor interleaves our Acquire+Release with the two floors, so
// that all three see the same disk at the same moments (a shared disk's
// latency drifts a lot between separate benchmarks), and reports the
// ratios.
func BenchmarkVsFloor(b *testing.B) {
	dir := b.TempDir()
	f := filelock.NewFactory(filelock.WithDir(dir), filelock.WithLogger(nil))
	defer f.Close()
	ctx := context.Background()
	path, tmp := filepath.Join(dir, "floor.lock"), filepath.Join(dir, "floor.tmp")
	data := make([]byte, 400)
	var ours, plain, durable time.Duration
	for b.Loop() {
		t0 := time.Now()
		h, err := f.Acquire(ctx, "bench")
		if err != nil {
			b.Fatal(err)
		}
		h.Release()
		t1 := time.Now()
		fd, _ := unix.Open(path, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, 0o644)
		unix.Close(fd)
		unix.Unlink(path)
		t2 := time.Now()
		fd, _ = unix.Open(tmp, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, 0o644)
		unix.Write(fd, data)
		unix.Fsync(fd)
		unix.Close(fd)
		unix.Link(tmp, path)
		unix.Unlink(tmp)
		unix.Unlink(path)
		t3 := time.Now()
		ours, plain, durable = ours+t1.Sub(t0), plain+t2.Sub(t1), durable+t3.Sub(t2)
	}
	n := float64(b.N)
	b.ReportMetric(float64(ours.Nanoseconds())/n, "ns/acquire+release")
	b.ReportMetric(float64(plain.Nanoseconds())/n, "ns/floor-create+remove")
	b.ReportMetric(float64(durable.Nanoseconds())/n, "ns/floor-durable")
	b.ReportMetric(float64(ours)/float64(plain), "x-create+remove")
	b.ReportMetric(float64(ours)/float64(durable), "x-durable")
}
