package memlock_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/memlock"
)

func Example() {
	locks := memlock.NewFactory()
	ctx := context.Background()

	h, _ := locks.Acquire(ctx, "nightly-import")
	_, err := locks.Acquire(ctx, "nightly-import")
	fmt.Println("second acquire locked:", errors.Is(err, lock.ErrLocked))
	h.Release()

	h2, _ := locks.Acquire(ctx, "nightly-import")
	fmt.Println("next token is larger:", h2.Token() > h.Token())
	h2.Release()
	// Output:
	// second acquire locked: true
	// next token is larger: true
}

// Tests of code that must stop when its lock is lost force the loss.
func ExampleFactory_ForceLoss() {
	locks := memlock.NewFactory()
	err := locks.WithLock(context.Background(), "export", func(ctx context.Context) error {
		locks.ForceLoss("export") // as if the lease had expired
		<-ctx.Done()
		return ctx.Err()
	})
	fmt.Println(errors.Is(err, lock.ErrLockLost))
	// Output: true
}

// A ManualClock expires leases without sleeping.
func ExampleManualClock() {
	clock := memlock.NewManualClock(time.Now())
	locks := memlock.NewFactory(memlock.WithClock(clock), memlock.WithTTL(5*time.Minute), memlock.WithAutoRenew(false))
	h, _ := locks.Acquire(context.Background(), "daily-export")
	clock.Advance(5 * time.Minute)
	<-h.Done()
	fmt.Println(h.Err())
	// Output: memlock: lock: lock lost: lease expired
}

// A test of a job's bound moves a ManualClock instead of waiting an hour.
func ExampleWithMaxHold() {
	clock := memlock.NewManualClock(time.Unix(0, 0))
	locks := memlock.NewFactory(memlock.WithClock(clock))
	ctx := context.Background()

	h, _ := locks.Acquire(ctx, "daily-export", memlock.WithMaxHold(time.Hour))
	clock.Advance(59 * time.Minute)
	fmt.Println("held after 59m:", h.Err() == nil)
	clock.Advance(time.Minute)
	<-h.Done()
	fmt.Println("ended at 1h:", errors.Is(h.Err(), lock.ErrMaxHold))
	h2, err := locks.Acquire(ctx, "daily-export")
	fmt.Println("next holder:", err == nil)
	h2.Release()
	// Output:
	// held after 59m: true
	// ended at 1h: true
	// next holder: true
}

// Readers of a schema hold it shared while a migration holds it
// exclusively: readers together, the migrator alone, and a migrator that
// waits is served before readers that come after it.
func ExampleWithShared() {
	locks := memlock.NewFactory()
	ctx := context.Background()

	r1, _ := locks.Acquire(ctx, "schema", memlock.WithShared())
	r2, err := locks.Acquire(ctx, "schema", memlock.WithShared())
	fmt.Println("two readers at once:", err == nil)

	migrated := make(chan uint64)
	go func() {
		m, _ := locks.Acquire(ctx, "schema", memlock.WithWait()) // waits for the readers
		migrated <- m.Token()
		m.Release()
	}()
	for locks.Waiting("schema") == 0 { // the migrator waits
		time.Sleep(time.Millisecond)
	}
	_, err = locks.Acquire(ctx, "schema", memlock.WithShared())
	fmt.Println("a new reader waits behind the migrator:", errors.Is(err, lock.ErrLocked))

	r1.Release()
	r2.Release()
	fmt.Println("migrator's token above the readers':", <-migrated > r2.Token())
	// Output:
	// two readers at once: true
	// a new reader waits behind the migrator: true
	// migrator's token above the readers': true
}
