// Command 09-per-user-serialization is use case 9: a user can ask for a
// "rebuild my timeline" that takes a while; five clicks in a row must run
// one rebuild at a time for that user, while other users' rebuilds run
// alongside.
//
// The lock name carries the user id ("rebuild-timeline:alice"), so each
// user has a lock of their own and many users' locks are independent keys
// (Redis keys, marker files). lock.WithLock acquires without waiting: a
// click while the user's rebuild runs gets ErrLocked at once and is told a
// rebuild is in progress. Underneath, WithLock acquires, runs the rebuild
// with a context cancelled if the lock is lost, and releases when it
// returns or panics; the Locker comes from AsLocker, whose lease is renewed
// in the background while the rebuild runs, so the TTL (2 minutes) is only
// the recovery window of a worker that crashes mid-rebuild, not a limit on
// the rebuild's length. This serializes; it does not deduplicate: a click
// after the rebuild finished starts a new one, as it should (the timeline
// may have changed).
//
//	go run ./09-per-user-serialization                  # filelock, no infrastructure
//	go run ./09-per-user-serialization -backend=redis
package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/examples/internal/replica"
)

// ErrAlreadyInProgress tells the user a rebuild of theirs is running.
var ErrAlreadyInProgress = errors.New("a rebuild of your timeline is already in progress")

// RebuildHandler serves rebuild requests on one replica.
type RebuildHandler struct {
	Locks   lock.Locker // this replica's, WithTTL(2*time.Minute)
	Rebuild func(ctx context.Context, userID string) error
}

// HandleRebuild rebuilds userID's timeline unless a rebuild of it is
// already running, on any replica.
func (h *RebuildHandler) HandleRebuild(ctx context.Context, userID string) error {
	err := lock.WithLock(ctx, h.Locks, "rebuild-timeline:"+userID, func(ctx context.Context) error {
		return h.Rebuild(ctx, userID)
	})
	if errors.Is(err, lock.ErrLocked) {
		return ErrAlreadyInProgress
	}
	return err
}

// result counts what happened per user.
type result struct {
	Rebuilds      map[string]int // rebuilds run
	InProgress    map[string]int // clicks answered ErrAlreadyInProgress
	MaxConcurrent map[string]int // most rebuilds of one user at once: must be 1
	Overlapped    bool           // bob's rebuild ran while alice's did
}

// run: alice clicks, then clicks four more times (on both replicas) while
// her rebuild runs; bob clicks meanwhile; alice clicks once more after her
// rebuild finished.
func run(ctx context.Context, c *replica.Cluster, work time.Duration) (res result, err error) {
	res = result{Rebuilds: map[string]int{}, InProgress: map[string]int{}, MaxConcurrent: map[string]int{}}
	var mu sync.Mutex
	running := map[string]int{}
	aliceRunning, aliceMayFinish := make(chan struct{}), make(chan struct{})
	var aliceOnce sync.Once
	rebuild := func(ctx context.Context, user string) error {
		mu.Lock()
		running[user]++
		res.Rebuilds[user]++
		res.MaxConcurrent[user] = max(res.MaxConcurrent[user], running[user])
		if user == "bob" && running["alice"] > 0 {
			res.Overlapped = true
		}
		mu.Unlock()
		defer func() {
			mu.Lock()
			running[user]--
			mu.Unlock()
		}()
		fmt.Printf("rebuilding %s's timeline\n", user)
		switch user {
		case "alice":
			aliceOnce.Do(func() {
				close(aliceRunning)
				<-aliceMayFinish // held open until the other clicks are in
			})
		}
		time.Sleep(work)
		return nil
	}

	var handlers []*RebuildHandler
	for range 2 {
		r, err := c.Replica(ctx, lock.WithTTL(2*time.Minute))
		if err != nil {
			return res, err
		}
		handlers = append(handlers, &RebuildHandler{Locks: r.Locker(), Rebuild: rebuild})
	}
	click := func(replica int, user string) error {
		err := handlers[replica].HandleRebuild(ctx, user)
		if errors.Is(err, ErrAlreadyInProgress) {
			mu.Lock()
			res.InProgress[user]++
			mu.Unlock()
			fmt.Printf("%s clicks on replica-%d: %v\n", user, replica+1, err)
			return nil
		}
		return err
	}

	first := make(chan error, 1)
	go func() { first <- click(0, "alice") }()
	select {
	case <-aliceRunning:
	case err := <-first:
		return res, fmt.Errorf("alice's first click returned before her rebuild ran: %v", err)
	}
	var wg sync.WaitGroup
	errs := make([]error, 5)
	for i := range 4 {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = click(i%2, "alice") }()
	}
	wg.Add(1)
	go func() { defer wg.Done(); errs[4] = click(1, "bob") }()
	// Bob is not kept waiting by alice's rebuild: his runs while hers is
	// held open.
	wg.Wait()
	close(aliceMayFinish)
	if err := errors.Join(append(errs, <-first)...); err != nil {
		return res, err
	}
	// After her rebuild finished, a new click rebuilds again.
	if err := click(1, "alice"); err != nil {
		return res, err
	}
	return res, nil
}

func main() {
	replica.Main(demo, replica.Filelock, replica.Redis, replica.Postgres, replica.Etcd)
}

func demo(ctx context.Context, c *replica.Cluster) error {
	res, err := run(ctx, c, 50*time.Millisecond)
	if err != nil {
		return err
	}
	fmt.Printf("rebuilds %v, answered 'in progress' %v\n", res.Rebuilds, res.InProgress)
	return nil
}
