package main

import (
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/ubgo/lock/examples/internal/exampletest"
	"github.com/ubgo/lock/internal/testenv"
)

// TestMain lets the test binary play the earlier attempts.
func TestMain(m *testing.M) {
	if testenv.Child() == childRole {
		attempt()
	}
	os.Exit(m.Run())
}

// TestScenario plays earlier attempts in real processes. Job 42: a retry
// while attempt 1 runs must skip; after attempt 1 is killed with SIGKILL a
// retry must run at once, although the stale window is 30 minutes. Job 43:
// a retry right after attempt 1 was frozen with SIGSTOP must skip; a retry
// after its stale window must run; attempt 1, resumed, must report its lock
// lost. filelock is the scenario's backend and needs no infrastructure.
func TestScenario(t *testing.T) {
	res, err := run(exampletest.Context(t), config{Dir: t.TempDir(), Stale: 2 * time.Second, Spawn: func() *exec.Cmd {
		return testenv.Command(t, childRole, "TestScenario")
	}})
	if err != nil {
		t.Fatal(err)
	}
	if !res.SkippedWhileRunning {
		t.Error("job 42 was launched again while attempt 1 was running")
	}
	if !res.RanAfterCrash {
		t.Error("job 42 was not retried after attempt 1 crashed")
	}
	if res.CrashRetryWaited > time.Minute {
		t.Errorf("the crashed attempt's retry waited %v: the stale window, not the probe, freed it", res.CrashRetryWaited)
	}
	if !res.SkippedWhileFrozen {
		t.Error("job 43 was launched again right after attempt 1 froze")
	}
	if !res.RanAfterStale {
		t.Error("job 43 was not retried after its stale window")
	}
	if !strings.HasPrefix(res.FrozenSawLoss, "lost: ") || !strings.Contains(res.FrozenSawLoss, "lock lost") {
		t.Errorf("the resumed attempt said %q, want its lock lost", res.FrozenSawLoss)
	}
}
