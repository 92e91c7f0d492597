//go:build unix

package flock_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ubgo/lock/flock"
	"github.com/ubgo/lock/internal/testenv"
)

// cpuPerOp reports the process's CPU time (user and system, all threads)
// per iteration beside the wall time: on a busy machine it varies less,
// since time spent waiting for a CPU does not count.
func cpuPerOp(b *testing.B) func() {
	cpu := func() time.Duration {
		var ru unix.Rusage
		unix.Getrusage(unix.RUSAGE_SELF, &ru)
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	start := cpu()
	return func() {
		b.ReportMetric(float64((cpu()-start).Nanoseconds())/float64(b.N), "cpu-ns/op")
	}
}

// BenchmarkFloor is the least an uncontended flock lock can cost: open the
// file, lock it, close it. BenchmarkAcquireRelease is measured against it.
func BenchmarkFloor(b *testing.B) {
	path := filepath.Join(b.TempDir(), "floor.lock")
	b.ReportAllocs()
	defer cpuPerOp(b)()
	for b.Loop() {
		fd, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_CLOEXEC, 0o644)
		if err != nil {
			b.Fatal(err)
		}
		if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
			b.Fatal(err)
		}
		unix.Close(fd)
	}
}

// BenchmarkFloorCounter is the floor of a lock with a durable per-name
// token counter that opens its file each time: the floor plus reading and
// writing the counter while locked.
func BenchmarkFloorCounter(b *testing.B) {
	path := filepath.Join(b.TempDir(), "floor.lock")
	buf := make([]byte, 512)
	rec := []byte("counter 1764480000000000001\n")
	b.ReportAllocs()
	defer cpuPerOp(b)()
	for b.Loop() {
		fd, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_CLOEXEC, 0o644)
		if err != nil {
			b.Fatal(err)
		}
		if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
			b.Fatal(err)
		}
		if _, err := unix.Pread(fd, buf, 0); err != nil {
			b.Fatal(err)
		}
		if _, err := unix.Pwrite(fd, rec, 0); err != nil {
			b.Fatal(err)
		}
		unix.Close(fd)
	}
}

// BenchmarkAcquireRelease is one uncontended mutex acquire and release:
// open, lock, read and write the record, close (FloorCounter is about its
// system calls).
func BenchmarkAcquireRelease(b *testing.B) {
	f := flock.NewFactory(flock.WithDir(b.TempDir()), flock.WithLogger(nil))
	defer f.Close()
	ctx := context.Background()
	b.ReportAllocs()
	defer cpuPerOp(b)()
	for b.Loop() {
		h, err := f.Acquire(ctx, "bench")
		if err != nil {
			b.Fatal(err)
		}
		h.Release()
	}
}

// BenchmarkSemaphore is one uncontended permit of a semaphore of 4.
func BenchmarkSemaphore(b *testing.B) {
	f := flock.NewFactory(flock.WithDir(b.TempDir()), flock.WithLogger(nil), flock.WithMaxConcurrent(4))
	defer f.Close()
	ctx := context.Background()
	b.ReportAllocs()
	defer cpuPerOp(b)()
	for b.Loop() {
		h, err := f.Acquire(ctx, "bench")
		if err != nil {
			b.Fatal(err)
		}
		h.Release()
	}
}

// BenchmarkHandoff measures the time from one goroutine's Release to a
// waiting goroutine's Acquire returning, in one process.
func BenchmarkHandoff(b *testing.B) {
	f := flock.NewFactory(flock.WithDir(b.TempDir()), flock.WithLogger(nil))
	defer f.Close()
	ctx := context.Background()
	h, err := f.Acquire(ctx, "pp")
	if err != nil {
		b.Fatal(err)
	}
	var total time.Duration
	for i := 0; i < b.N; i++ {
		got := make(chan *flock.Holder)
		go func() {
			w, err := f.Acquire(ctx, "pp", flock.WithWait())
			if err != nil {
				b.Error(err)
			}
			got <- w
		}()
		testenv.Eventually(b, 10*time.Second, "the waiter waiting", func() bool { return flock.Waiting(f.Dir(), "pp") > 0 })
		start := time.Now()
		h.Release()
		h = <-got
		total += time.Since(start)
	}
	h.Release()
	b.ReportMetric(float64(total.Nanoseconds())/float64(b.N), "ns/handoff")
}

// BenchmarkContended is throughput with every goroutine waiting on one
// name.
func BenchmarkContended(b *testing.B) {
	f := flock.NewFactory(flock.WithDir(b.TempDir()), flock.WithLogger(nil))
	defer f.Close()
	ctx := context.Background()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			h, err := f.Acquire(ctx, "hot", flock.WithWait())
			if err != nil {
				b.Error(err)
				return
			}
			h.Release()
		}
	})
}
