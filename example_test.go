package lock_test

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/backend"
)

// mutexLocker is the smallest Locker: one in-process mutex per name and no
// fencing beyond a counter. Real code uses a backend such as memlock.
type mutexLocker struct {
	mu     sync.Mutex
	held   map[string]bool
	tokens map[string]uint64
}

type mutexHolder struct {
	l     *mutexLocker
	name  string
	token uint64
	state *backend.State
}

func (l *mutexLocker) Acquire(ctx context.Context, name string) (lock.Holder, error) {
	if err := lock.ValidateName(name); err != nil {
		return nil, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.held[name] {
		return nil, lock.ErrLocked
	}
	l.held[name] = true
	l.tokens[name]++
	return &mutexHolder{l, name, l.tokens[name], backend.NewState()}, nil
}

func (h *mutexHolder) Release() error {
	if h.state.End() {
		h.l.mu.Lock()
		delete(h.l.held, h.name)
		h.l.mu.Unlock()
	}
	return nil
}
func (h *mutexHolder) Token() uint64         { return h.token }
func (h *mutexHolder) Done() <-chan struct{} { return h.state.Done() }
func (h *mutexHolder) Err() error            { return h.state.Err() }

func ExampleWithLock() {
	var l lock.Locker = &mutexLocker{held: map[string]bool{}, tokens: map[string]uint64{}}
	ctx := context.Background()

	err := lock.WithLock(ctx, l, "nightly-import", func(ctx context.Context) error {
		// A second replica finds the job running and skips it.
		inner := lock.WithLock(ctx, l, "nightly-import", func(context.Context) error { return nil })
		fmt.Println("second replica skipped:", errors.Is(inner, lock.ErrLocked))
		return nil
	})
	fmt.Println("first replica:", err)
	// Output:
	// second replica skipped: true
	// first replica: <nil>
}
