//go:build linux

package chaos

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ubgo/lock"
)

// TestCancelledWaitMatchesErrLocked: a waiting Acquire whose ctx ends
// while it waits returns an error matching both ErrLocked and the ctx
// error (the root contract's WaitError), whatever step of the wait the
// ctx ended in. The factory is warmed up first (its sessions, leases and
// watches exist), so the ctx ends during the wait, not while connecting.
//
// Found by the chaos run of etcdlock (TestChaos/etcdlock, CHAOS_SEED=1): a
// wait cancelled while its queue transaction was in flight returned the
// bare "context canceled"; and again by that of redislock, whose first
// attempt, cancelled mid-script, returned "redislock: acquire: context
// canceled". backend.Take now says it alike for every backend.
func TestCancelledWaitMatchesErrLocked(t *testing.T) {
	for _, b := range backendNames {
		t.Run(b, func(t *testing.T) {
			if ref := known[b]["cancel"]; ref != "" && !strict() {
				t.Skip("known issue, skipped until fixed (CHAOS_STRICT=1 runs it): " + ref)
			}
			sc := scope(t, b)
			holderF := newFactory(t, b, sc...)
			defer holderF.close()
			f := holderF // memlock: factories never contend with each other
			if b != "memlock" {
				f = newFactory(t, b, sc...)
				defer f.close()
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			h, err := holderF.acquire(ctx, "held")
			if err != nil {
				t.Fatal(err)
			}
			defer h.Release()
			// Warm up: one long wait on the same name opens whatever the
			// factory needs for it (session, listener, lease, watch).
			wctx, wcancel := context.WithTimeout(ctx, 300*time.Millisecond)
			_, err = f.acquire(wctx, "held", lock.WithWait())
			wcancel()
			if !errors.Is(err, lock.ErrLocked) {
				t.Fatalf("warm-up wait: %v", err)
			}
			// Deadlines from already past, through shorter than a round
			// trip (the ctx ends mid-request), to a few milliseconds.
			bad := 0
			for i := 0; i < 40; i++ {
				d := time.Duration(i*i) * 5 * time.Microsecond
				wctx, wcancel := context.WithTimeout(context.Background(), d)
				_, err := f.acquire(wctx, "held", lock.WithWait())
				wcancel()
				if !errors.Is(err, lock.ErrLocked) || !errors.Is(err, context.DeadlineExceeded) {
					bad++
					if bad <= 3 {
						t.Errorf("Acquire(WithWait) on a held name, ctx deadline %v: %v; want an error matching lock.ErrLocked and context.DeadlineExceeded", d, err)
					}
				}
			}
			if bad > 3 {
				t.Errorf("... %d of 40 waits in all", bad)
			}
		})
	}
}
