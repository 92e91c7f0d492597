package locktest_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/backend"
	"github.com/ubgo/lock/locktest"
)

var (
	errLocked = fmt.Errorf("toy: %w", lock.ErrLocked)
	errLost   = fmt.Errorf("toy: %w", lock.ErrLockLost)
)

// toy is a small locker whose flaws the self-test switches on, to prove the
// suite notices them.
type toy struct {
	cfg          backend.Config
	fence        *lock.MemoryFence // the fence Break raises
	mu           sync.Mutex
	holders      map[string]map[*toyHolder]bool
	tokens       map[string]uint64
	queue        map[string][]uint64 // the waiting Acquires' tickets, in arrival order
	ticket       uint64              // the last ticket given
	admit        int                 // holders admitted per name: 1 is correct
	lifo         bool                // serve the last waiter to come first
	breakNothing bool                // Break reports success and frees nothing
	repeatTokens bool                // hand out the same token again
	liveTokens   bool                // Token reads the name's counter, which refused attempts move
	barge        bool                // a waiting Acquire takes a held lock
	holdForever  bool                // ignore WithMaxHold
	keepAtMax    bool                // at WithMaxHold, tell the holder but keep the name held
	takeShared   bool                // take WithShared as an exclusive lock instead of refusing it
}

type toyHolder struct {
	t     *toy
	name  string
	token uint64
	state *backend.State
}

func (t *toy) acquire(ctx context.Context, name string, opts ...lock.Option) (*toyHolder, error) {
	o, err := t.cfg.Resolve(name, opts, func(o *lock.Options) error {
		if o.Shared && !t.takeShared {
			return fmt.Errorf("%w: WithShared is not supported by toy", lock.ErrInvalidOption)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		if o.Wait {
			return nil, fmt.Errorf("%w: %w", errLocked, err)
		}
		return nil, err
	}
	if h := t.try(name, &o, 0); h != nil || !o.Wait {
		if h == nil {
			return nil, errLocked
		}
		return h, nil
	}
	if o.WaitTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, o.WaitTimeout)
		defer cancel()
	}
	t.mu.Lock()
	t.ticket++
	ticket := t.ticket
	t.queue[name] = append(t.queue[name], ticket)
	t.mu.Unlock()
	defer func() {
		t.mu.Lock()
		t.queue[name] = slices.DeleteFunc(t.queue[name], func(k uint64) bool { return k == ticket })
		t.mu.Unlock()
	}()
	for {
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%w: %w", errLocked, ctx.Err())
		case <-time.After(time.Millisecond):
		}
		if h := t.try(name, &o, ticket); h != nil {
			return h, nil
		}
	}
}

// try takes name if it is free and its turn: a waiter's (ticket > 0) when
// it is the first in line, or with lifo the last; an attempt's when no
// one waits.
func (t *toy) try(name string, o *lock.Options, ticket uint64) *toyHolder {
	t.mu.Lock()
	defer t.mu.Unlock()
	q := t.queue[name]
	turn := len(q) == 0
	switch {
	case ticket > 0 && t.lifo:
		turn = q[len(q)-1] == ticket
	case ticket > 0:
		turn = q[0] == ticket
	}
	if len(t.holders[name]) >= t.admit && !(t.barge && o.Wait) || !turn {
		if t.liveTokens {
			t.tokens[name]++
		}
		return nil
	}
	if !t.repeatTokens {
		t.tokens[name]++
	}
	h := &toyHolder{t: t, name: name, token: t.tokens[name] + 1, state: backend.NewState()}
	if t.holders[name] == nil {
		t.holders[name] = map[*toyHolder]bool{}
	}
	t.holders[name][h] = true
	if !t.holdForever {
		h.state.Bound(o, errLost, nil, h.lose)
	}
	return h
}

// lose ends h with err, and frees its name unless the toy keeps it.
func (h *toyHolder) lose(err error) {
	if h.state.Lose(err) && !h.t.keepAtMax {
		h.free()
	}
}

func (h *toyHolder) free() {
	h.t.mu.Lock()
	delete(h.t.holders[h.name], h)
	h.t.mu.Unlock()
}

func (t *toy) waiters(name string) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.queue[name])
}

// Break frees every holder of name, after raising the fence above them.
func (t *toy) Break(ctx context.Context, name string) error {
	if err := lock.ValidateName(name); err != nil {
		return err
	}
	t.mu.Lock()
	hs := t.holders[name]
	if len(hs) == 0 {
		t.mu.Unlock()
		return fmt.Errorf("toy: break: %w: %q", lock.ErrNotHeld, name)
	}
	if t.breakNothing {
		t.mu.Unlock()
		return nil
	}
	var top uint64
	for h := range hs {
		top = max(top, h.token)
	}
	t.fence.RejectIfStale(ctx, name, top+1) // a higher record stays
	delete(t.holders, name)
	t.mu.Unlock()
	for h := range hs {
		h.state.Lose(backend.Loss(errLost, lock.ErrRemoved, "broken"))
	}
	return nil
}

func (h *toyHolder) Release() error {
	if h.state.End() {
		h.free()
	}
	return h.state.Err()
}
func (h *toyHolder) Token() uint64 {
	if h.t.liveTokens {
		h.t.mu.Lock()
		defer h.t.mu.Unlock()
		return h.t.tokens[h.name] + 1
	}
	return h.token
}
func (h *toyHolder) Done() <-chan struct{} { return h.state.Done() }
func (h *toyHolder) Err() error            { return h.state.Err() }

func runToy(t *testing.T, toy *toy, hook bool) {
	toy.cfg = backend.NewConfig("toy", nil, nil)
	toy.fence = lock.NewMemoryFence()
	toy.holders, toy.tokens, toy.queue = map[string]map[*toyHolder]bool{}, map[string]uint64{}, map[string][]uint64{}
	if toy.admit == 0 {
		toy.admit = 1
	}
	newLocker := func(_ testing.TB, opts ...lock.Option) lock.Locker {
		return backend.Locker(&toy.cfg, opts, toy.acquire)
	}
	b := locktest.Backend{
		New:         newLocker,
		ErrLocked:   errLocked,
		ErrLockLost: errLost,
		Wait:        true,
		LossBound:   time.Second, // the toy ends a holder at once
		Breaker:     func(testing.TB) locktest.Breaker { return toy },
		Fence:       func(testing.TB) lock.Fence { return toy.fence },
	}
	if hook {
		// Waiters are counted as they queue: the FIFO test can tell
		// their order.
		b.Waiting, b.FIFO = toy.waiters, newLocker
	}
	locktest.Run(t, b)
}

// TestToy shows the suite passes a correct locker, so the failures below
// come from the flaws and not from the toy.
func TestToy(t *testing.T) {
	t.Run("Waiting", func(t *testing.T) { runToy(t, &toy{}, true) })
	t.Run("NoWaiting", func(t *testing.T) { runToy(t, &toy{}, false) })
}

// TestBrokenToy runs the suite on a flawed toy, in a child process started
// by TestSuiteCatchesBrokenLockers.
func TestBrokenToy(t *testing.T) {
	switch os.Getenv("LOCKTEST_BROKEN") {
	case "two-holders":
		// Without the hook: waiters let in would keep it from ever
		// counting them, and each test would wait out its bound.
		runToy(t, &toy{admit: 2}, false)
	case "repeat-tokens":
		runToy(t, &toy{repeatTokens: true}, true)
	case "live-tokens":
		runToy(t, &toy{liveTokens: true}, true)
	case "hold-forever":
		runToy(t, &toy{holdForever: true}, true)
	case "keep-at-max":
		runToy(t, &toy{keepAtMax: true}, true)
	case "takes-shared":
		runToy(t, &toy{takeShared: true}, true)
	case "lifo":
		runToy(t, &toy{lifo: true}, true)
	case "break-nothing":
		runToy(t, &toy{breakNothing: true}, true)
	case "barging-waiter":
		// Without the Waiting hook, the suite cannot wait for the waiter
		// to wait: the waiter's own record of when it got in catches it.
		runToy(t, &toy{barge: true}, false)
	default:
		t.Skip("run by TestSuiteCatchesBrokenLockers")
	}
}

func TestSuiteCatchesBrokenLockers(t *testing.T) {
	for flaw, wantFail := range map[string][]string{
		"two-holders":    {"TestBrokenToy/Exclusion", "TestBrokenToy/MutualExclusion"},
		"repeat-tokens":  {"TestBrokenToy/Tokens", "TestBrokenToy/MutualExclusion"},
		"live-tokens":    {"TestBrokenToy/Tokens"},
		"barging-waiter": {"TestBrokenToy/Wait"},
		"hold-forever":   {"TestBrokenToy/MaxHold"},
		"keep-at-max":    {"TestBrokenToy/MaxHold"},
		"takes-shared":   {"TestBrokenToy/Shared/Options"},
		"lifo":           {"TestBrokenToy/FIFO"},
		"break-nothing":  {"TestBrokenToy/Break/Mutex", "TestBrokenToy/Break/Free"},
	} {
		t.Run(flaw, func(t *testing.T) {
			// Only the tests that must fail: the others pass the toy
			// (TestToy), some slowly.
			var run []string
			for _, name := range wantFail {
				top, _, _ := strings.Cut(strings.TrimPrefix(name, "TestBrokenToy/"), "/")
				run = append(run, top)
			}
			cmd := exec.Command(os.Args[0], "-test.run=^TestBrokenToy$/^("+strings.Join(run, "|")+")$", "-test.v")
			cmd.Env = append(os.Environ(), "LOCKTEST_BROKEN="+flaw)
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("the suite passed a locker with flaw %s:\n%s", flaw, out)
			}
			for _, name := range wantFail {
				if !strings.Contains(string(out), "--- FAIL: "+name+" ") {
					t.Errorf("flaw %s: %s did not fail:\n%s", flaw, name, out)
				}
			}
		})
	}
}
