package locktest_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"

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
	admit        int  // holders admitted per name: 1 is correct
	repeatTokens bool // hand out the same token again
}

type toyHolder struct {
	t     *toy
	name  string
	token uint64
	state *backend.State
}

func (t *toy) acquire(ctx context.Context, name string, opts ...lock.Option) (*toyHolder, error) {
	if _, err := t.cfg.Resolve(name, opts, nil); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.held[name] >= t.admit {
		return nil, errLocked
	}
	t.held[name]++
	if !t.repeatTokens {
		t.tokens[name]++
	}
	return &toyHolder{t: t, name: name, token: t.tokens[name] + 1, state: backend.NewState()}, nil
}

func (h *toyHolder) Release() error {
	if h.state.End() {
		h.t.mu.Lock()
		h.t.held[h.name]--
		h.t.mu.Unlock()
	}
	return nil
}
func (h *toyHolder) Token() uint64         { return h.token }
func (h *toyHolder) Done() <-chan struct{} { return h.state.Done() }
func (h *toyHolder) Err() error            { return h.state.Err() }

func runToy(t *testing.T, admit int, repeat bool) {
	toy := &toy{cfg: backend.NewConfig("toy", nil, nil), held: map[string]int{}, tokens: map[string]uint64{}, admit: admit, repeatTokens: repeat}
	locktest.Run(t, locktest.Backend{
		New: func(_ testing.TB, opts ...lock.Option) lock.Locker {
			return backend.Locker(&toy.cfg, opts, toy.acquire)
		},
		ErrLocked:   errLocked,
		ErrLockLost: errLost,
	})
}

// TestToy shows the suite passes a correct locker, so the failures below
// come from the flaws and not from the toy.
func TestToy(t *testing.T) { runToy(t, 1, false) }

// TestBrokenToy runs the suite on a flawed toy, in a child process started
// by TestSuiteCatchesBrokenLockers.
func TestBrokenToy(t *testing.T) {
	switch os.Getenv("LOCKTEST_BROKEN") {
	case "two-holders":
		runToy(t, 2, false)
	case "repeat-tokens":
		runToy(t, 1, true)
	default:
		t.Skip("run by TestSuiteCatchesBrokenLockers")
	}
}

func TestSuiteCatchesBrokenLockers(t *testing.T) {
	for flaw, wantFail := range map[string][]string{
		"two-holders":   {"TestBrokenToy/Exclusion", "TestBrokenToy/MutualExclusion"},
		"repeat-tokens": {"TestBrokenToy/Tokens", "TestBrokenToy/MutualExclusion"},
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
