//go:build linux

package chaos

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ubgo/lock/backend"
)

// The fault matrix (issue 30) holds every network backend to the rule for
// how a call ends (backend.Take, lock.WaitError): an Acquire returns
// within its ctx's end (deadline, or WithWaitTimeout) plus backend.Grace,
// whatever the store does; it matches ErrLocked only when the store's
// last answer, fresh, was "held", and otherwise names the outage; what a
// caller that gave up leaves in the store is gone within the backend's
// clean-up bound once the store is back; and the next caller is served.
//
// Each cell is a backend, a fault, when it strikes, what is asked (kind)
// and how long the call may take (mode). Holder A (connected straight to
// the server) holds the name; caller B (through the fault proxy) asks for
// it. The faults last until B has returned, so the store says nothing
// after them: every fault cell expects an outage, and the "none" row,
// the same call with no fault, expects contention (a backend that always
// said "outage" would otherwise pass). `go test` runs a slice; CHAOS_LONG=1
// (make chaos) the whole matrix; CHAOS_MATRIX=<regexp> picks cells by
// "backend/fault/when/kind/mode".

var (
	matrixRuns = flag.Int("chaos.matrix.runs", int(envUint("CHAOS_MATRIX_RUNS")), "runs of each matrix cell (0: 2 in the long run, 1 in the short)")
	matrixOnly = flag.String("chaos.matrix", os.Getenv("CHAOS_MATRIX"), "regexp of the matrix cells to run, on backend/fault/when/kind/mode")
)

const (
	// mxSlack is added to every bound: it catches real overruns, not the
	// scheduling noise of a shared 2-core machine.
	mxSlack = time.Second
	// mxFaultAt: a wait's fault strikes this long after the waiter is seen
	// queued.
	mxFaultAt = 300 * time.Millisecond
	mxShort   = time.Second     // the deadline of a call that does not wait
	mxLong    = 2 * time.Second // the deadline or WithWaitTimeout of a wait
	mxGocron  = 500 * time.Millisecond
)

var (
	mxBackends = []string{"pglock", "redislock", "etcdlock"}
	mxFaults   = []string{"none", "kill", "stop", "blackhole", "reset"}
	mxMoments  = []string{"before", "wait", "trip"}
	mxKinds    = []string{"mutex", "shared", "semaphore", "all", "gocron", "run"}
)

// What each word of a cell means, for the table's legend.
var mxLegend = []string{
	"faults: kill = server SIGKILL (restarted on its data after); stop = server SIGSTOP (SIGCONT after);",
	"  blackhole = the proxy holds all traffic and new connections; reset = the proxy resets every connection, new ones too;",
	"  none = no fault, A holds the name: the control, which must say ErrLocked. Every fault lasts until B has returned.",
	"when: before = the fault is on when B calls; wait = B is seen queued behind A, the fault 300ms later;",
	"  trip = the name is free and B's acquiring request reaches the server, whose reply is then lost",
	"  (kill, reset: the server executed it) or held (blackhole), or the server is frozen as it arrives (stop).",
	"kinds: mutex; shared = B WithShared, A exclusive; semaphore = WithMaxConcurrent(2), A holds both permits;",
	"  all = lock.AcquireAll of two names, A holding the second; gocron = gocronlock's Lock; run = the lock binary, lock run -w.",
	"took: the longest of the runs; bound = the call's deadline + backend.Grace + 1s slack.",
	"C: after the store is back and A released, a fresh client's wait for everything B asked for (bound: the backend's clean-up bound + 1s).",
	"next: B's own factory (or a new lock run) takes it once more.",
}

// mxCell is one cell of the matrix.
type mxCell struct{ backend, fault, when, kind, mode string }

func (c mxCell) String() string {
	return strings.Join([]string{c.backend, c.fault, c.when, c.kind, c.mode}, "/")
}

// modes are the ways each kind is asked: nowait (ctx deadline, no wait),
// wait (WithWait and a ctx deadline), waittimeout (WithWaitTimeout).
func mxModes(kind string) []string {
	switch kind {
	case "all":
		return []string{"wait"}
	case "gocron":
		// gocronlock refuses a Locker built with WithWait.
		return []string{"nowait"}
	case "run":
		return []string{"waittimeout"}
	}
	return []string{"nowait", "wait", "waittimeout"}
}

// modeLabel says how the call is bounded.
func (c mxCell) modeLabel() string {
	switch {
	case c.kind == "gocron":
		return "WithLockTimeout 500ms"
	case c.kind == "run":
		return "-w 2s"
	}
	return map[string]string{"nowait": "no wait, ctx 1s", "wait": "WithWait, ctx 2s", "waittimeout": "WithWaitTimeout 2s"}[c.mode]
}

// deadline is how long after its start the call's ctx (or wait) ends.
func (c mxCell) deadline() time.Duration {
	switch {
	case c.kind == "run" && c.when == "before" && c.fault != "none":
		// "lock checks the server with one round trip (at most 5s)
		// first" (docs/guides/cmd-lock.md).
		return 5 * time.Second
	case c.kind == "gocron":
		return mxGocron
	case c.mode == "nowait":
		return mxShort
	}
	return mxLong
}

// skip says why a cell makes no sense, or "".
func (c mxCell) skip() string {
	switch {
	case c.when == "wait" && c.mode == "nowait":
		return "no wait to strike"
	case c.kind == "run" && c.when == "trip":
		return "a new process: its first round trip is the connect check (before)"
	}
	return ""
}

// want is the error class the cell must end with.
func (c mxCell) want() string {
	if c.fault == "none" {
		return "locked"
	}
	return "outage"
}

// mxSliceKind is the one kind per backend that the short run covers.
var mxSliceKind = map[string]string{"pglock": "mutex", "redislock": "shared", "etcdlock": "semaphore"}

// mxSliceExtra are cells the short run adds: a gocronlock Lock on a
// frozen Redis with go-redis' default client (WithLockTimeout ran to
// go-redis' timeouts), and a lock run -w whose Redis dies mid-wait (it
// exited 1, "still held").
var mxSliceExtra = []string{"redislock/stop/before/gocron/nowait", "redislock/kill/wait/run/waittimeout"}

// mxCells lists the matrix in table order: the whole of it in the long
// run, else the slice (one kind per backend, WithWait and a deadline, the
// faults during the wait and the round trip, and the control).
func mxCells(long bool) []mxCell {
	var cs []mxCell
	for _, b := range mxBackends {
		for _, f := range mxFaults {
			for _, w := range mxMoments {
				if f == "none" && w != "before" {
					continue
				}
				for _, k := range mxKinds {
					for _, m := range mxModes(k) {
						c := mxCell{b, f, w, k, m}
						if long || k == mxSliceKind[b] && m == "wait" && (w != "before" || f == "none") || slices.Contains(mxSliceExtra, c.String()) {
							cs = append(cs, c)
						}
					}
				}
			}
		}
	}
	return cs
}

// mxOutcome is what the runs of one cell measured.
type mxOutcome struct {
	runs        int
	took, bound time.Duration
	class       string // outage, locked, acquired, hung; "" before the call ran
	err         string // B's error (of the run that failed, if one did)
	clean, next time.Duration
	fails       []string
	notes       []string // remarks that fail nothing
}

func (o *mxOutcome) fail(format string, args ...any) {
	o.fails = append(o.fails, fmt.Sprintf(format, args...))
}

func (o *mxOutcome) note(s string) {
	if !slices.Contains(o.notes, s) {
		o.notes = append(o.notes, s)
	}
}

// merge adds run r to o: the longest times, the first failing run's class
// and error.
func (o *mxOutcome) merge(r mxOutcome) {
	if o.runs == 0 || len(o.fails) == 0 && len(r.fails) > 0 {
		o.class, o.err = r.class, r.err
	}
	o.runs++
	o.took, o.bound = max(o.took, r.took), r.bound
	o.clean, o.next = max(o.clean, r.clean), max(o.next, r.next)
	o.fails = append(o.fails, r.fails...)
	for _, n := range r.notes {
		o.note(n)
	}
}

func TestFaultMatrix(t *testing.T) {
	runs := *matrixRuns
	if runs <= 0 {
		runs = 1
		if *longFlag {
			runs = 2
		}
	}
	var only *regexp.Regexp
	if *matrixOnly != "" {
		only = regexp.MustCompile(*matrixOnly)
	}
	var cells []mxCell
	for _, c := range mxCells(*longFlag || only != nil) {
		if only == nil || only.MatchString(c.String()) {
			cells = append(cells, c)
		}
	}
	redis.SetLogger(mxQuiet{}) // the pool's dial errors are the faults at work
	var mu sync.Mutex
	results := map[mxCell]*mxOutcome{}
	bin := &mxBin{dir: t.TempDir()}
	start := time.Now()
	// The backends run side by side, each on servers of its own; the
	// cells of one backend one after the other.
	t.Run("backend", func(t *testing.T) {
		for _, b := range mxBackends {
			var mine []mxCell
			for _, c := range cells {
				if c.backend == b && c.skip() == "" {
					mine = append(mine, c)
				}
			}
			if len(mine) == 0 {
				continue
			}
			t.Run(b, func(t *testing.T) {
				t.Parallel()
				m := startMatrix(t, b, bin)
				for run := range runs {
					for _, c := range mine {
						r := m.runCell(c)
						t.Logf("run %d %v: took %v (bound %v), %s, C %v, next %v %s %s", run+1, c, r.took.Round(time.Millisecond),
							r.bound, r.class, r.clean.Round(time.Millisecond), r.next.Round(time.Millisecond), strings.Join(r.fails, "; "), r.err)
						mu.Lock()
						o := results[c]
						if o == nil {
							o = &mxOutcome{}
							results[c] = o
						}
						o.merge(r)
						mu.Unlock()
					}
				}
				for _, c := range mine {
					if o := results[c]; o != nil && len(o.fails) > 0 {
						t.Errorf("%v (%s): %s; error: %s", c, c.modeLabel(), strings.Join(o.fails, "; "), o.err)
					}
				}
			})
		}
	})
	fmt.Printf("\nfault matrix: %d cells, %d run(s) each, %v\n", len(cells), runs, time.Since(start).Round(time.Second))
	printMatrix(os.Stdout, cells, results)
}

type mxQuiet struct{}

func (mxQuiet) Printf(context.Context, string, ...any) {}

// printMatrix writes the table, then the legend and the failing cells
// with their errors.
func printMatrix(w io.Writer, cells []mxCell, results map[mxCell]*mxOutcome) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "backend\tfault\twhen\tkind\tmode\ttook\tbound\tclass (want)\tC\tnext\tresult")
	var failed []mxCell
	for _, c := range cells {
		row := []string{c.backend, c.fault, c.when, c.kind, c.modeLabel()}
		o := results[c]
		switch {
		case c.skip() != "":
			row = append(row, "-", "-", "-", "-", "-", "skipped: "+c.skip())
		case o == nil:
			row = append(row, "-", "-", "-", "-", "-", "not run")
		default:
			res := "pass"
			if len(o.notes) > 0 {
				res += " (" + strings.Join(o.notes, "; ") + ")"
			}
			if len(o.fails) > 0 {
				res = "FAIL: " + strings.Join(slices.Compact(slices.Sorted(slices.Values(o.fails))), "; ")
				failed = append(failed, c)
			}
			row = append(row, dur(o.took), dur(o.bound), fmt.Sprintf("%s (%s)", cmp.Or(o.class, "?"), c.want()), dur(o.clean), dur(o.next), res)
		}
		fmt.Fprintln(tw, strings.Join(row, "\t"))
	}
	tw.Flush()
	fmt.Fprintln(w)
	for _, l := range mxLegend {
		fmt.Fprintln(w, l)
	}
	if len(failed) > 0 {
		fmt.Fprintf(w, "\n%d failing cells:\n", len(failed))
		for _, c := range failed {
			o := results[c]
			fmt.Fprintf(w, "- %v (%s): took %v, %s; error: %s\n", c, c.modeLabel(), dur(o.took), strings.Join(o.fails, "; "), cmp.Or(o.err, "none"))
		}
	}
}

func dur(d time.Duration) string {
	if d == 0 {
		return "0"
	}
	return d.Round(time.Millisecond).String()
}

// bound is how long cell c's call may take.
func (c mxCell) bound() time.Duration { return c.deadline() + backend.Grace + mxSlack }
