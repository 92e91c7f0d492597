// Command demo is the family's main job on the zero-infrastructure default:
// three simulated replicas race for the same cron tick, one wins and runs
// it, the others skip; then a waiting worker queues behind a holder and
// takes over the moment it releases, with a larger fencing token.
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"sync"
	"time"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/memlock"
)

func main() {
	ctx := context.Background()
	// In production this is pglock, redislock or etcdlock; replicas only
	// ever see the lock.Locker interface.
	locks := memlock.NewFactory()

	fmt.Println("== three replicas, one cron tick")
	tick := "billing@" + time.Now().UTC().Truncate(time.Hour).Format(time.RFC3339)
	var wg sync.WaitGroup
	var mu sync.Mutex
	for _, replica := range []string{"replica-1", "replica-2", "replica-3"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := runTick(ctx, locks.AsLocker(), tick, func(token uint64) {
				mu.Lock()
				defer mu.Unlock()
				fmt.Printf("%s: won %s, running billing (fencing token %d)\n", replica, tick, token)
				time.Sleep(50 * time.Millisecond)
			})
			if errors.Is(err, lock.ErrLocked) {
				mu.Lock()
				fmt.Printf("%s: %s already running elsewhere, skipping\n", replica, tick)
				mu.Unlock()
			} else if err != nil {
				log.Fatal(err)
			}
		}()
	}
	wg.Wait()

	fmt.Println("== a waiting acquire hands off in FIFO order")
	first, err := locks.Acquire(ctx, "report")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("worker-a: holds report (token %d)\n", first.Token())
	got := make(chan *memlock.Holder)
	go func() {
		h, err := locks.Acquire(ctx, "report", memlock.WithWait())
		if err != nil {
			log.Fatal(err)
		}
		got <- h
	}()
	for locks.Waiting("report") == 0 {
		time.Sleep(time.Millisecond)
	}
	fmt.Println("worker-b: waiting for report")
	start := time.Now()
	first.Release()
	second := <-got
	fmt.Printf("worker-b: took report %v after worker-a released (token %d > %d)\n",
		time.Since(start).Round(time.Microsecond), second.Token(), first.Token())
	second.Release()
}

// runTick runs job for tick if this replica wins the lock.
func runTick(ctx context.Context, l lock.Locker, tick string, job func(token uint64)) error {
	h, err := l.Acquire(ctx, tick)
	if err != nil {
		return err
	}
	defer h.Release()
	job(h.Token())
	return nil
}
