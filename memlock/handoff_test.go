package memlock_test

import (
	"context"
	"testing"
	"time"

	"github.com/ubgo/lock/internal/testenv"
	"github.com/ubgo/lock/memlock"
)

// TestLossPrecedesHandoff checks the lease rule every backend keeps: a
// holder learns of its loss (Done closed) before a successor holds. It runs
// many rounds of an expired lease (ManualClock) and of ForceLoss, each with
// a waiter queued; when the waiter's Acquire returns, the old holder's Done
// must already be closed. A hand-off made before the loss is signalled
// shows up within a hundred rounds under -race, a few thousand without.
func TestLossPrecedesHandoff(t *testing.T) {
	rounds := 10000
	if testing.Short() {
		rounds = 2000
	}
	for _, how := range []string{"ttl", "forceloss"} {
		t.Run(how, func(t *testing.T) {
			clock := memlock.NewManualClock(time.Unix(0, 0))
			f := memlock.NewFactory(memlock.WithClock(clock), memlock.WithLogger(nil))
			ctx := context.Background()
			for i := range rounds {
				var opts []memlock.Option
				if how == "ttl" {
					opts = append(opts, memlock.WithTTL(time.Second), memlock.WithAutoRenew(false))
				}
				old, err := f.Acquire(ctx, "h", opts...)
				if err != nil {
					t.Fatal(err)
				}
				early := make(chan bool, 1)
				go func() {
					w, err := f.Acquire(ctx, "h", memlock.WithWait())
					if err != nil {
						t.Error(err)
						early <- false
						return
					}
					var open bool
					select {
					case <-old.Done():
					default:
						open = true
					}
					w.Release() // before reporting, so the next round finds the name free
					early <- open
				}()
				testenv.Eventually(t, 10*time.Second, "the waiter queued", func() bool { return f.Waiting("h") > 0 })
				if how == "ttl" {
					clock.Advance(time.Second)
				} else {
					f.ForceLoss("h")
				}
				if <-early {
					t.Fatalf("round %d: the waiter held the lock while the old holder's Done was open", i)
				}
			}
		})
	}
}
