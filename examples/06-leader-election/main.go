// Command 06-leader-election is use case 6: across the replicas, one — the
// leader — runs the periodic background work (cache warming, stats); when
// it dies another takes over, and a deposed leader's late actions are
// refused.
//
// Every replica calls lock.Lead, which is leader election on any Locker.
// Underneath, Lead loops until its context ends: it campaigns by acquiring
// "leader" (on ErrLocked it waits the retry interval and tries again; other
// errors back off, doubling); once elected it runs the work with the
// holder's fencing token as the epoch and a context cancelled when the lock
// is lost; when the work returns it releases — only then, so a successor
// never starts while the work still runs — and campaigns again. The Locker
// comes from AsLocker, whose leases renew in the background, so a healthy
// leader never loses its lease. lock.CurrentLeader asks the backend who
// holds "leader" (Inspect) and returns the holder with the highest token;
// each replica's Locker carries WithOwner, so the answer names it.
//
// A leader that died (or paused past its lease) may still act before it
// notices: every side effect is fenced with the epoch. Here the leader's
// writes go through a lock.MemoryFence (the downstream store, in this
// process); in a database, a fence column in the written row does the same
// (docs/design/patterns.md).
//
// With etcd (the scenario's backend) a dead leader's lease expires after
// the TTL and a follower's next campaign wins; with flock (no
// infrastructure) the kernel frees the lock the moment the process ends.
//
//	go run ./06-leader-election                  # flock, no infrastructure
//	go run ./06-leader-election -backend=etcd
package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/examples/internal/replica"
)

// RunAsLeader runs leaderWork whenever this replica leads, until ctx ends.
// leaderWork must return promptly when its context is cancelled, and fence
// its side effects with the epoch.
func RunAsLeader(ctx context.Context, locks lock.Locker, retry time.Duration,
	leaderWork func(ctx context.Context, epoch uint64) error) error {
	return lock.Lead(ctx, locks, "leader", leaderWork, lock.WithLeadRetry(retry))
}

// config sizes the demo.
type config struct {
	Replicas int
	TTL      time.Duration // lease of the lease backends: a dead leader's lock frees after it
	Retry    time.Duration // followers campaign this often
	Every    time.Duration // the leader's work interval
}

// term is one leadership: who, with which epoch.
type term struct {
	Replica string
	Epoch   uint64
}

// result is what the demo saw.
type result struct {
	Terms        []term        // in order of their first write
	Takeover     time.Duration // from the leader's death to its successor's first write
	StaleErr     error         // the dead leader's late write
	Current      string        // lock.CurrentLeader's answer after the takeover
	MaxLeaders   int           // most live replicas running leader work at once: must be 1
	RejectedLive int           // writes of live leaders the fence refused: must be 0
}

// store is the downstream resource the leader writes to, fenced by epoch.
type store struct {
	fence *lock.MemoryFence
	mu    sync.Mutex
	terms []term
	wrote chan term
}

func (s *store) write(ctx context.Context, who string, epoch uint64) error {
	return s.fence.Apply(ctx, "stats", epoch, func() error {
		s.mu.Lock()
		defer s.mu.Unlock()
		if n := len(s.terms); n == 0 || s.terms[n-1].Epoch != epoch {
			t := term{who, epoch}
			s.terms = append(s.terms, t)
			fmt.Printf("%s leads, epoch %d\n", who, epoch)
			select {
			case s.wrote <- t:
			default: // nobody is watching any more
			}
		}
		return nil
	})
}

func run(ctx context.Context, c *replica.Cluster, cfg config) (res result, err error) {
	st := &store{fence: lock.NewMemoryFence(), wrote: make(chan term, 64)}
	var (
		maxLeaders, rejected atomic.Int32
		running              = make([]atomic.Bool, cfg.Replicas) // leader work started and not returned
		dead                 = make([]atomic.Bool, cfg.Replicas)
		replicas             = make([]*replica.Replica, cfg.Replicas)
		wg                   sync.WaitGroup
	)
	ctx, stop := context.WithCancel(ctx)
	defer func() {
		stop()
		wg.Wait()
	}()
	for i := range replicas {
		name := fmt.Sprintf("replica-%d", i+1)
		r, err := c.Replica(ctx, lock.WithTTL(cfg.TTL), lock.WithOwner(name))
		if err != nil {
			return res, err
		}
		replicas[i] = r
		work := func(ctx context.Context, epoch uint64) error {
			running[i].Store(true)
			defer running[i].Store(false)
			n := int32(0)
			for j := range running {
				if running[j].Load() && !dead[j].Load() {
					n++
				}
			}
			for m := maxLeaders.Load(); n > m && !maxLeaders.CompareAndSwap(m, n); m = maxLeaders.Load() {
			}
			t := time.NewTicker(cfg.Every)
			defer t.Stop()
			for {
				if dead[i].Load() {
					// A dead process runs nothing; its lock is freed by
					// the backend, which then cancels ctx.
					<-ctx.Done()
					return ctx.Err()
				}
				if err := st.write(ctx, name, epoch); errors.Is(err, lock.ErrStaleToken) {
					if !dead[i].Load() { // not a write in flight as it died
						rejected.Add(1)
					}
					return err
				}
				select {
				case <-ctx.Done():
					return nil
				case <-t.C:
				}
			}
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			RunAsLeader(ctx, r.Locker(), cfg.Retry, work)
		}()
	}

	first, err := next(ctx, st.wrote)
	if err != nil {
		return res, err
	}
	var firstIdx int
	fmt.Sscanf(first.Replica, "replica-%d", &firstIdx)
	fmt.Printf("%s dies\n", first.Replica)
	died := time.Now()
	dead[firstIdx-1].Store(true)
	replicas[firstIdx-1].Crash()
	for {
		t, err := next(ctx, st.wrote)
		if err != nil {
			return res, err
		}
		if t.Epoch > first.Epoch {
			res.Takeover = time.Since(died)
			fmt.Printf("%s took over %v after the leader died\n", t.Replica, res.Takeover.Round(time.Millisecond))
			break
		}
	}

	// The dead leader's last action, replayed late (a process that was
	// only paused would do exactly this): refused by the fence.
	res.StaleErr = st.write(ctx, first.Replica, first.Epoch)
	fmt.Printf("%s writes late with epoch %d: %v\n", first.Replica, first.Epoch, res.StaleErr)

	// Who leads, as an operator would ask the backend. Ask a live replica.
	live := replicas[firstIdx%cfg.Replicas]
	if h, ok, err := lock.CurrentLeader(ctx, live.Factory, "leader"); err != nil {
		return res, err
	} else if ok {
		res.Current = h.Owner
		fmt.Printf("CurrentLeader: %s, epoch %d\n", h.Owner, h.Token)
	}

	stop()
	wg.Wait()
	st.mu.Lock()
	res.Terms = st.terms
	st.mu.Unlock()
	res.MaxLeaders, res.RejectedLive = int(maxLeaders.Load()), int(rejected.Load())
	return res, nil
}

func next(ctx context.Context, ch <-chan term) (term, error) {
	select {
	case t := <-ch:
		return t, nil
	case <-ctx.Done():
		return term{}, fmt.Errorf("no leader: %w", ctx.Err())
	}
}

func main() {
	replica.Main(demo, replica.Flock, replica.Etcd, replica.Filelock, replica.Postgres, replica.Redis)
}

func demo(ctx context.Context, c *replica.Cluster) error {
	_, err := run(ctx, c, config{Replicas: 3, TTL: 2 * time.Second, Retry: 100 * time.Millisecond, Every: 20 * time.Millisecond})
	return err
}
