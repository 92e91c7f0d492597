package flock_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"

	"github.com/ubgo/lock/flock"
)

// A cron job that must not overlap with a previous run still going on the
// same host (the seed's scenario 1).
func Example() {
	dir, _ := os.MkdirTemp("", "example")
	defer os.RemoveAll(dir)
	ctx := context.Background()

	fl := flock.New("nightly-import", flock.WithDir(dir))
	holder, err := fl.Acquire(ctx)
	if errors.Is(err, flock.ErrLocked) {
		log.Println("previous run still active; skipping")
		return
	}
	if err != nil {
		log.Fatal(err)
	}
	defer holder.Release()

	// A second run while the first holds the lock skips.
	_, err = flock.New("nightly-import", flock.WithDir(dir)).Acquire(ctx)
	fmt.Println(errors.Is(err, flock.ErrLocked))
	// Output: true
}

// At most three indexers at once, on one host.
func ExampleWithMaxConcurrent() {
	dir, _ := os.MkdirTemp("", "example")
	defer os.RemoveAll(dir)
	ctx := context.Background()
	locks := flock.NewFactory(flock.WithDir(dir), flock.WithMaxConcurrent(3))
	defer locks.Close()

	var held []*flock.Holder
	for i := 0; i < 4; i++ {
		h, err := locks.Acquire(ctx, "indexer")
		if errors.Is(err, flock.ErrLocked) {
			fmt.Println("all 3 slots busy")
			continue
		}
		held = append(held, h)
		fmt.Println("slot", h.Path()[len(dir)+1:])
	}
	for _, h := range held {
		h.Release()
	}
	// Output:
	// slot indexer.0.lock
	// slot indexer.1.lock
	// slot indexer.2.lock
	// all 3 slots busy
}

// WithLock runs a function under the lock; meanwhile Inspect shows who
// holds it.
func ExampleFactory_WithLock() {
	dir, _ := os.MkdirTemp("", "example")
	defer os.RemoveAll(dir)
	locks := flock.NewFactory(flock.WithDir(dir))
	defer locks.Close()

	err := locks.WithLock(context.Background(), "report", func(ctx context.Context) error {
		info, err := locks.Inspect(ctx, "report")
		if err != nil {
			return err
		}
		fmt.Println("holders:", len(info.Holders), "token > 0:", info.Holders[0].Token > 0)
		return nil
	}, flock.WithOwner("job-42"))
	fmt.Println("err:", err)
	// Output:
	// holders: 1 token > 0: true
	// err: <nil>
}

// Waiting for a lock held by someone else, up to a deadline.
func ExampleWithWait() {
	dir, _ := os.MkdirTemp("", "example")
	defer os.RemoveAll(dir)
	locks := flock.NewFactory(flock.WithDir(dir))
	defer locks.Close()
	ctx := context.Background()

	first, _ := locks.Acquire(ctx, "migrate")
	done := make(chan *flock.Holder)
	go func() {
		h, err := locks.Acquire(ctx, "migrate", flock.WithWait())
		if err != nil {
			log.Fatal(err)
		}
		done <- h
	}()
	first.Release()
	second := <-done
	fmt.Println(second.Token() > first.Token())
	second.Release()
	// Output: true
}
