package main

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/ubgo/lock/examples/internal/exampletest"
	"github.com/ubgo/lock/examples/internal/replica"
	"github.com/ubgo/lock/internal/testenv"
)

// TestMain lets the test binary play the stuck previous run.
func TestMain(m *testing.M) {
	if testenv.Child() == childRole {
		stuckImport()
	}
	os.Exit(m.Run())
}

// TestScenario runs the demo with a real second process: while it holds
// the lock and hangs, the import must skip and the lock must name that
// process; once it is killed with SIGKILL the import must run at once, with
// no cleanup. flock is the scenario's backend; filelock its alternative
// with readable markers. Neither needs infrastructure.
func TestScenario(t *testing.T) {
	for _, b := range []string{replica.Flock, replica.Filelock} {
		t.Run(b, func(t *testing.T) {
			t.Parallel()
			res, err := run(exampletest.Context(t), config{Backend: b, Dir: t.TempDir(), Spawn: func() *exec.Cmd {
				return testenv.Command(t, childRole, "TestScenario")
			}})
			if err != nil {
				t.Fatal(err)
			}
			if !res.SkippedWhileStuck {
				t.Error("the import ran while the previous run held the lock")
			}
			if want := fmt.Sprintf("%d@", res.StuckPID); !strings.HasPrefix(res.Holder, want) {
				t.Errorf("the lock names %q as holder, want the stuck process %s...", res.Holder, want)
			}
			if !res.RanAfterKill {
				t.Error("the import did not run after the stuck run was killed")
			}
		})
	}
}
