//go:build linux

package chaos

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/flock"
)

// TestFlockSweepNoSpuriousErrLocked: a non-waiting Acquire of a name that
// nobody holds succeeds, even while a background sweep runs in the same
// directory. Found by FuzzOptions (testdata/fuzz/FuzzOptions/0f1a8cb1ed63d5b1,
// flock with WithPruneAfter(6ns), now WithSweepAfter): the sweep takes
// LOCK_EX|LOCK_NB on every name's lock file it lists, including one an
// Acquire has just opened (or created: an empty record is swept whatever
// its age), and that Acquire's LOCK_NB then fails and it returns ErrLocked
// for a free name. With WithSweepAfter(1h) a sweep runs once an hour, so
// the window is rare but real for names created or reused while it runs
// (and for any sweep by Factory.Sweep). Fixed: the
// sweeper holds ubgo-flock.sweep while it holds a name's file, and a busy
// non-waiting Acquire waits for it and tries again.
func TestFlockSweepNoSpuriousErrLocked(t *testing.T) {
	for _, n := range []int{1, 16} {
		dir := t.TempDir()
		var fails atomic.Int64
		var first atomic.Value
		var wg sync.WaitGroup
		for g := 0; g < 4; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < 300 && fails.Load() == 0; i++ {
					f := flock.NewFactory(flock.WithDir(dir), flock.WithSweepAfter(1), flock.WithLogger(nil))
					h, err := f.Acquire(context.Background(), fmt.Sprintf("n%d-%d-%d", n, g, i), lock.WithMaxConcurrent(n))
					if err != nil {
						fails.Add(1)
						first.CompareAndSwap(nil, err)
					} else {
						h.Release()
					}
					f.Close()
				}
			}()
		}
		wg.Wait()
		if fails.Load() > 0 {
			t.Errorf("limit %d: Acquire of a free name during a sweep: %v", n, first.Load())
		}
	}
}
