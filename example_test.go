package lock_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

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

func ExampleAcquireAll() {
	var l lock.Locker = &mutexLocker{held: map[string]bool{}, tokens: map[string]uint64{}}
	ctx := context.Background()

	// A transfer takes both accounts, in the canonical order whatever
	// order it lists them in, so two transfers never deadlock.
	set, err := lock.AcquireAll(ctx, l, "account:7", "account:42")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer set.Release()
	fmt.Println("account:7 token:", set.Member("account:7").Token())

	// Another transfer needs account:42 too: it fails, and the account:1
	// it took first is released again.
	_, err = lock.AcquireAll(ctx, l, "account:42", "account:1")
	fmt.Println("second transfer locked out:", errors.Is(err, lock.ErrLocked))
	h, err := l.Acquire(ctx, "account:1")
	fmt.Println("account:1 free:", err == nil)
	h.Release()
	// Output:
	// account:7 token: 1
	// second transfer locked out: true
	// account:1 free: true
}

// maxHoldLocker is mutexLocker honouring WithMaxHold, the way every
// backend does: backend.State.Bound calls lose at the bound.
type maxHoldLocker struct {
	*mutexLocker
	opts lock.Options
}

func (l *maxHoldLocker) Acquire(ctx context.Context, name string) (lock.Holder, error) {
	h, err := l.mutexLocker.Acquire(ctx, name)
	if err != nil {
		return nil, err
	}
	mh := h.(*mutexHolder)
	mh.state.Bound(&l.opts, lock.ErrLockLost, nil, mh.lose)
	return mh, nil
}

// lose tells the holder, then frees the name (under the locker's mutex,
// so an Acquire after Done finds it free).
func (h *mutexHolder) lose(err error) {
	h.l.mu.Lock()
	defer h.l.mu.Unlock()
	if h.state.Lose(err) {
		delete(h.l.held, h.name)
	}
}

func ExampleWithMaxHold() {
	// Backends take the option as any other: redislock.WithMaxHold(time.Hour).
	opts, _ := lock.Apply(lock.Options{}, lock.WithMaxHold(20*time.Millisecond))
	l := &maxHoldLocker{&mutexLocker{held: map[string]bool{}, tokens: map[string]uint64{}}, opts}
	ctx := context.Background()

	err := lock.WithLock(ctx, l, "daily-export", func(ctx context.Context) error {
		<-ctx.Done() // a stuck job: only the bound ends it
		fmt.Println("job cancelled by the bound:", errors.Is(context.Cause(ctx), lock.ErrMaxHold))
		return ctx.Err()
	})
	fmt.Println("WithLock says lost:", errors.Is(err, lock.ErrLockLost))
	h, err := l.Acquire(ctx, "daily-export")
	fmt.Println("next run can start:", err == nil)
	h.Release()
	// Output:
	// job cancelled by the bound: true
	// WithLock says lost: true
	// next run can start: true
}
