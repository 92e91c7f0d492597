//go:build unix

package filelock_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/ubgo/lock/filelock"
)

func Example() {
	dir, _ := os.MkdirTemp("", "filelock-example")
	defer os.RemoveAll(dir)
	locks := filelock.NewFactory(filelock.WithDir(dir))
	defer locks.Close()
	ctx := context.Background()

	err := locks.WithLock(ctx, "job:nightly-import", func(ctx context.Context) error {
		// Another process (here: another factory) finds the job running.
		other := filelock.NewFactory(filelock.WithDir(dir))
		defer other.Close()
		_, err := other.Acquire(ctx, "job:nightly-import")
		fmt.Println("second runner:", errors.Is(err, filelock.ErrLocked))
		return nil
	}, filelock.WithStaleAfter(30*time.Minute), filelock.WithOwner("run-2026-05-04"))
	if err != nil {
		log.Fatal(err)
	}
	// Output: second runner: true
}

func ExampleFactory_Acquire_semaphore() {
	dir, _ := os.MkdirTemp("", "filelock-example")
	defer os.RemoveAll(dir)
	locks := filelock.NewFactory(filelock.WithDir(dir))
	defer locks.Close()
	ctx := context.Background()

	var held []*filelock.Holder
	for i := 0; i < 4; i++ {
		h, err := locks.Acquire(ctx, "indexer", filelock.WithMaxConcurrent(3))
		if errors.Is(err, filelock.ErrLocked) {
			fmt.Println("all 3 slots busy")
			continue
		}
		held = append(held, h)
		fmt.Println("slot file:", h.Path()[len(dir)+1:])
	}
	for _, h := range held {
		h.Release()
	}
	// Output:
	// slot file: indexer.0.lock
	// slot file: indexer.1.lock
	// slot file: indexer.2.lock
	// all 3 slots busy
}

func ExampleFactory_Sweep() {
	dir, _ := os.MkdirTemp("", "filelock-example")
	defer os.RemoveAll(dir)
	locks := filelock.NewFactory(filelock.WithDir(dir))
	defer locks.Close()

	// Markers of holders that died on this host, or whose stale window ran
	// out, are removed once an hour has passed since they were last
	// written; live ones are left alone.
	n, err := locks.Sweep(context.Background(), time.Hour)
	fmt.Println(n, err)
	// Output: 0 <nil>
}
