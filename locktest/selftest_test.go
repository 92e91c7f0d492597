package locktest_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
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
	mu           sync.Mutex
	held         map[string]int
	tokens       map[string]uint64
	waiting      map[string]int
	admit        int  // holders admitted per name: 1 is correct
	repeatTokens bool // hand out the same token again
	liveTokens   bool // Token reads the name's counter, which refused attempts move
	barge        bool // a waiting Acquire takes a held lock
	holdForever  bool // ignore WithMaxHold
	keepAtMax    bool // at WithMaxHold, tell the holder but keep the name held
	takeShared   bool // take WithShared as an exclusive lock instead of refusing it
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
	if h := t.try(name, &o); h != nil || !o.Wait {
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
	t.waiting[name]++
	t.mu.Unlock()
	defer func() {
		t.mu.Lock()
		t.waiting[name]--
		t.mu.Unlock()
	}()
	for {
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%w: %w", errLocked, ctx.Err())
		case <-time.After(time.Millisecond):
		}
		if h := t.try(name, &o); h != nil {
			return h, nil
		}
	}
}

func (t *toy) try(name string, o *lock.Options) *toyHolder {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.held[name] >= t.admit && !(t.barge && o.Wait) {
		if t.liveTokens {
			t.tokens[name]++
		}
		return nil
	}
	t.held[name]++
	if !t.repeatTokens {
		t.tokens[name]++
	}
	h := &toyHolder{t: t, name: name, token: t.tokens[name] + 1, state: backend.NewState()}
	if !t.holdForever {
		h.state.Bound(o, errLost, nil, h.lose)
	}
	return h
}

// lose ends h with err, and frees its name unless the toy keeps it.
func (h *toyHolder) lose(err error) {
	if h.state.Lose(err) && !h.t.keepAtMax {
		h.t.mu.Lock()
		h.t.held[h.name]--
		h.t.mu.Unlock()
	}
}

func (t *toy) waiters(name string) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.waiting[name]
}

func (h *toyHolder) Release() error {
	if h.state.End() {
		h.t.mu.Lock()
		h.t.held[h.name]--
		h.t.mu.Unlock()
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
	toy.held, toy.tokens, toy.waiting = map[string]int{}, map[string]uint64{}, map[string]int{}
	if toy.admit == 0 {
		toy.admit = 1
	}
	b := locktest.Backend{
		New: func(_ testing.TB, opts ...lock.Option) lock.Locker {
			return backend.Locker(&toy.cfg, opts, toy.acquire)
		},
		ErrLocked:   errLocked,
		ErrLockLost: errLost,
		Wait:        true,
	}
	if hook {
		b.Waiting = toy.waiters
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
	} {
		t.Run(flaw, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run=^TestBrokenToy$", "-test.v")
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
