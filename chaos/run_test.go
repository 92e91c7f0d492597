//go:build linux

package chaos

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ubgo/lock/internal/testenv"
)

// setupErr records a failure of the harness itself (not of the backend):
// it fails the run as a violation.
func (r *run) setupErr(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.crashes = append(r.crashes, "harness: "+err.Error())
}

// slack is added to every documented bound before it is checked: the
// machine is small, shared and runs the race detector.
const slack = 3 * time.Second

type runConfig struct {
	duration time.Duration // of the fault phase
	once     bool          // the fault phase injects every kind once and ends (go test -short)
	clients  int
	seed     uint64
	csWork   time.Duration // longest pause inside a critical section
	gap      time.Duration // longest quiet time between two faults
}

// fault is one injected fault, as the parent saw it.
type fault struct {
	kind       string
	target     int // client id, or -1
	targetHeld bool
	start, end int64
	detail     string
	skipped    bool // no client was in the state the fault needs
	// first acquire (by anyone) that returned after start, and after end;
	// 0 if none came within the bound.
	afterStart, afterEnd int64
}

type run struct {
	t      *testing.T
	b      *backendDef
	cfg    runConfig
	id     string // unique per run: key prefixes, application names
	name   string // the lock name every client takes
	work   string // register, histories, server data
	env    []string
	custom map[string]func() fault
	inproc func() (newLocker, func(), error)
	rng    *rand.Rand

	mu       sync.Mutex
	procs    map[int]*proc
	nextID   int
	acqs     []int64        // acquire-return times clients reported
	kills    map[int]int64  // client → when SIGKILL was sent
	stops    map[int][]span // client → when it was stopped
	crashes  []string       // clients that died by themselves
	hung     []string       // clients that did not exit when told
	faults   []fault
	rounds   []round // of the paused-waiter test
	stopping bool
	note     notifier // of the clients' states
}

type span struct{ from, to int64 }

type proc struct {
	id     int
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	c      *client       // in-process client
	stop   chan struct{} // in-process client
	exited chan struct{}

	mu     sync.Mutex
	state  string // starting, ready, wait, held, free, bye
	pid    int    // pglock backend pid while held
	killed bool
	tok    uint64         // token of the last "held"
	seen   map[string]int // states entered, counted
	note   *notifier      // told of every state entered
}

func (p *proc) setState(s string, pid int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.state, p.pid = s, pid
	if p.seen == nil {
		p.seen = map[string]int{}
	}
	p.seen[s]++
	if p.note != nil {
		p.note.notify()
	}
}

// count returns how many times p entered state.
func (p *proc) count(state string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.seen[state]
}

func (p *proc) getState() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.state
}

func (p *proc) pgPID() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.pid
}

// token returns the token of p's last "held".
func (p *proc) token() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.tok
}

// notifier wakes whoever awaits a change of the clients' states.
type notifier struct {
	mu sync.Mutex
	ch chan struct{}
}

// changed returns a channel closed at the next change.
func (n *notifier) changed() <-chan struct{} {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.ch == nil {
		n.ch = make(chan struct{})
	}
	return n.ch
}

func (n *notifier) notify() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.ch != nil {
		close(n.ch)
		n.ch = nil
	}
}

// await waits until cond holds: it checks it again whenever a client
// reports a state, and every poll if poll > 0 (for a condition no client
// reports). It gives up after d, or once one of ps has exited.
func (r *run) await(d, poll time.Duration, cond func() bool, ps ...*proc) bool {
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	var tick <-chan time.Time
	if poll > 0 {
		t := time.NewTicker(poll)
		defer t.Stop()
		tick = t.C
	}
	for {
		changed := r.note.changed()
		if cond() {
			return true
		}
		for _, p := range ps {
			select {
			case <-p.exited:
				return false
			default:
			}
		}
		select {
		case <-changed:
		case <-tick:
		case <-deadline.C:
			return cond()
		}
	}
}

func newRun(t *testing.T, b *backendDef, cfg runConfig) *run {
	r := &run{t: t, b: b, cfg: cfg,
		id:     fmt.Sprintf("%s-%d-%x", b.name, cfg.seed, time.Now().UnixNano()&0xffffff),
		work:   t.TempDir(),
		custom: map[string]func() fault{},
		rng:    rand.New(rand.NewPCG(cfg.seed, 0xc4a05)),
		procs:  map[int]*proc{}, kills: map[int]int64{}, stops: map[int][]span{},
	}
	t.Cleanup(func() {
		for _, p := range r.live() {
			if p.cmd != nil {
				p.cmd.Process.Signal(syscall.SIGCONT)
				p.cmd.Process.Kill()
			}
		}
	})
	// A name with the characters that need escaping, so every run also
	// goes through each backend's mapping.
	r.name = "chaos/" + r.id + ":register.0"
	return r
}

func (r *run) mkdir(sub string) string {
	d := filepath.Join(r.work, sub)
	if err := os.MkdirAll(d, 0o755); err != nil {
		r.t.Fatal(err)
	}
	return d
}

func (r *run) getenv(k string) string {
	for i := len(r.env) - 1; i >= 0; i-- {
		if v, ok := strings.CutPrefix(r.env[i], k+"="); ok {
			return v
		}
	}
	return os.Getenv(k)
}

// spawn starts one more client.
func (r *run) spawn() {
	r.mu.Lock()
	if r.stopping {
		r.mu.Unlock()
		return
	}
	id := r.nextID
	r.nextID++
	p := &proc{id: id, state: "starting", exited: make(chan struct{}), note: &r.note}
	r.procs[id] = p
	r.mu.Unlock()

	if r.b.inProcess {
		r.spawnInProcess(p)
		return
	}
	env := append(slices.Clone(r.env),
		envBackend+"="+r.b.name, envClient+"="+strconv.Itoa(id), envWork+"="+r.work,
		envName+"="+r.name, envSeed+"="+strconv.FormatUint(r.cfg.seed, 10), envCSWork+"="+r.cfg.csWork.String())
	cmd := testenv.Command(r.t, "chaos-client", "TestChaos", env...)
	// A client dies with the parent, even a stopped one whose stdin
	// closing would not wake it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stderr, err := os.Create(filepath.Join(r.work, fmt.Sprintf("client-%d.stderr", id)))
	if err == nil {
		cmd.Stderr = stderr
		defer stderr.Close()
	}
	p.stdin, _ = cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	if err == nil {
		err = cmd.Start()
	}
	if err != nil {
		// Called from the goroutine that saw a client exit, too: record,
		// do not Fatal.
		r.mu.Lock()
		r.crashes = append(r.crashes, fmt.Sprintf("client %d could not start: %v", id, err))
		r.mu.Unlock()
		close(p.exited)
		return
	}
	p.cmd = cmd
	lines := make(chan struct{})
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			r.heard(p, sc.Text())
		}
	}()
	go func() {
		<-lines
		err := cmd.Wait()
		p.setState("bye", 0)
		close(p.exited)
		r.mu.Lock()
		stopping := r.stopping
		p.mu.Lock()
		killed := p.killed
		p.mu.Unlock()
		if err != nil && !killed {
			tail, _ := os.ReadFile(filepath.Join(r.work, fmt.Sprintf("client-%d.stderr", id)))
			if len(tail) > 2000 {
				tail = tail[len(tail)-2000:]
			}
			r.crashes = append(r.crashes, fmt.Sprintf("client %d: %v: %s", id, err, tail))
		}
		r.mu.Unlock()
		if !stopping {
			r.spawn() // keep the number of contenders
		}
	}()
}

func (r *run) spawnInProcess(p *proc) {
	mk, closeFn, err := r.inproc()
	if err != nil {
		r.t.Fatal(err)
	}
	hist, err := openHistory(historyPath(r.work, p.id))
	if err != nil {
		r.t.Fatal(err)
	}
	reg, err := openRegister(r.work, p.id)
	if err != nil {
		r.t.Fatal(err)
	}
	hist.add(hev{K: "start", PID: os.Getpid(), T1: now()})
	p.c = &client{id: p.id, name: r.name, locker: mk(), shared: r.b.sharedLocker(mk), reg: reg, hist: hist,
		rng: rand.New(rand.NewPCG(r.cfg.seed, uint64(p.id))), work: r.cfg.csWork,
		say: func(format string, args ...any) { r.heard(p, fmt.Sprintf(format, args...)) }}
	p.stop = make(chan struct{})
	p.setState("ready", 0)
	go func() {
		defer close(p.exited)
		p.c.run(p.stop)
		closeFn()
		reg.close()
		hist.f.Close()
		p.setState("bye", 0)
	}()
}

// heard handles a progress line of a client.
func (r *run) heard(p *proc, line string) {
	f := strings.Fields(line)
	if len(f) == 0 {
		return
	}
	switch f[0] {
	case "held":
		var t int64
		var pid int
		var tok uint64
		if len(f) >= 4 {
			tok, _ = strconv.ParseUint(f[1], 10, 64)
			t, _ = strconv.ParseInt(f[2], 10, 64)
			pid, _ = strconv.Atoi(f[3])
		}
		p.mu.Lock()
		p.tok = tok
		p.mu.Unlock()
		p.setState("held", pid)
		r.mu.Lock()
		r.acqs = append(r.acqs, t)
		r.mu.Unlock()
	case "wait", "free", "ready", "bye":
		p.setState(f[0], 0)
	}
}

func (r *run) live() []*proc {
	r.mu.Lock()
	defer r.mu.Unlock()
	var ps []*proc
	for _, p := range r.procs {
		select {
		case <-p.exited:
		default:
			ps = append(ps, p)
		}
	}
	slices.SortFunc(ps, func(a, b *proc) int { return a.id - b.id })
	return ps
}

// pick returns a live client in state, chosen by the seeded generator,
// waiting up to 500ms for one; nil if none.
func (r *run) pick(state string) *proc {
	var in []*proc
	if !testenv.Poll(500*time.Millisecond, func() bool {
		in = in[:0]
		for _, p := range r.live() {
			if p.getState() == state {
				in = append(in, p)
			}
		}
		return len(in) > 0
	}) {
		return nil
	}
	return in[r.rng.IntN(len(in))]
}

func (r *run) pickHolder() *proc { return r.pick("held") }

// inject applies one fault of kind and returns what was done.
func (r *run) inject(kind string) fault {
	if fn := r.custom[kind]; fn != nil {
		f := fn()
		if f.kind == "" {
			f.kind = kind
		}
		if f.target == 0 && !f.targetHeld {
			f.target = -1
		}
		return f
	}
	f := fault{kind: kind, target: -1}
	switch kind {
	case fKill:
		p := r.pickHolder()
		if p == nil {
			f.detail, f.skipped = "no holder", true
			f.start, f.end = now(), now()
			return f
		}
		f.target, f.targetHeld = p.id, true
		p.mu.Lock()
		p.killed = true
		p.mu.Unlock()
		f.start = now()
		r.mu.Lock()
		r.kills[p.id] = f.start
		r.mu.Unlock()
		p.cmd.Process.Kill()
		<-p.exited
		f.end = now()
	case fStop, fStopWait:
		state, none := "held", "no holder"
		if kind == fStopWait {
			state, none = "wait", "no waiter"
		}
		p := r.pick(state)
		if p == nil {
			f.detail, f.skipped = none, true
			f.start, f.end = now(), now()
			return f
		}
		f.target, f.targetHeld = p.id, kind == fStop
		f.start = now()
		p.cmd.Process.Signal(syscall.SIGSTOP)
		time.Sleep(r.b.stopFor)
		p.cmd.Process.Signal(syscall.SIGCONT)
		f.end = now()
		r.addStop(p.id, f.start, f.end)
	case fCancel:
		p := r.pick("wait")
		f.start = now()
		if p != nil {
			f.target = p.id
			if p.c != nil {
				p.c.cancelWait()
			} else {
				p.cmd.Process.Signal(syscall.SIGUSR1)
			}
		} else {
			f.detail, f.skipped = "no waiter", true
		}
		f.end = now()
	default:
		r.t.Fatalf("fault %q not available for %s", kind, r.b.name)
	}
	return f
}

// addStop records that client was stopped (SIGSTOP) from from to to.
func (r *run) addStop(client int, from, to int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stops[client] = append(r.stops[client], span{from, to})
}

// firstAcqAfter returns the first acquire reported to have returned after
// t, waiting until deadline for one; 0 if none.
func (r *run) firstAcqAfter(t int64, deadline time.Time) int64 {
	var first int64
	testenv.Poll(time.Until(deadline), func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		for _, a := range r.acqs {
			if a > t && (first == 0 || a < first) {
				first = a
			}
		}
		return first != 0
	})
	return first
}

// faultPhase injects faults on the seeded schedule until the phase's
// duration is over: every kind once in a shuffled order, then at random.
func (r *run) faultPhase() {
	end := time.Now().Add(r.cfg.duration)
	time.Sleep(500 * time.Millisecond) // let every client start
	var queue []string
	kinds := slices.Compact(slices.Sorted(slices.Values(r.b.faults)))
	queue = append(queue, kinds...)
	r.rng.Shuffle(len(queue), func(i, j int) { queue[i], queue[j] = queue[j], queue[i] })
	bound := r.b.recover + slack
	for len(queue) > 0 || !r.cfg.once && time.Now().Before(end) {
		var kind string
		if len(queue) > 0 {
			kind, queue = queue[0], queue[1:]
		} else {
			kind = r.b.faults[r.rng.IntN(len(r.b.faults))]
		}
		f := r.inject(kind)
		// Wait for the next acquire before the next fault, so that each
		// unavailability belongs to one fault.
		f.afterEnd = r.firstAcqAfter(f.end, time.Now().Add(bound+2*time.Second))
		f.afterStart = r.firstAcqAfter(f.start, time.Now())
		r.mu.Lock()
		r.faults = append(r.faults, f)
		r.mu.Unlock()
		time.Sleep(time.Duration(r.rng.Int64N(int64(r.cfg.gap))))
	}
}

// finish stops every client: each finishes its critical section and
// exits. A client that does not exit within 20s is killed and reported.
func (r *run) finish() {
	r.mu.Lock()
	r.stopping = true
	r.mu.Unlock()
	for _, p := range r.live() {
		if p.c != nil {
			close(p.stop)
		} else {
			p.cmd.Process.Signal(syscall.SIGCONT)
			p.stdin.Close()
		}
	}
	deadline := time.After(20 * time.Second)
	for _, p := range r.live() {
		select {
		case <-p.exited:
		case <-deadline:
			r.mu.Lock()
			r.hung = append(r.hung, fmt.Sprintf("client %d (state %s) did not exit 20s after being told", p.id, p.getState()))
			r.mu.Unlock()
			if p.cmd != nil {
				p.mu.Lock()
				p.killed = true
				p.mu.Unlock()
				p.cmd.Process.Kill()
				<-p.exited
			}
		}
	}
}

// probe is check 4's last step: with every fault over and every client
// gone, a fresh contender gets the lock within the documented bound.
func (r *run) probe() (time.Duration, error) {
	var mk newLocker
	var closeFn func()
	var err error
	if r.b.inProcess {
		mk, closeFn, err = r.inproc()
	} else {
		mk, closeFn, err = r.b.client(r.getenv)
	}
	if err != nil {
		return 0, err
	}
	locker := mk()
	defer closeFn()
	ctx, cancel := context.WithTimeout(context.Background(), r.b.recover+slack)
	defer cancel()
	start := time.Now()
	h, err := locker.Acquire(ctx, r.name)
	if err != nil {
		return time.Since(start), err
	}
	d := time.Since(start)
	return d, h.Release()
}

// execute runs the whole experiment, with phase (the faults, or the
// paused-waiter rounds) between the start and the end of the clients, and
// returns its analysis.
func (r *run) execute(phase func()) *report {
	if err := r.b.setup(r); err != nil {
		if u, ok := err.(unavailable); ok {
			testenv.Unavailable(r.t, u.service, u.err)
		}
		r.t.Fatal(err)
	}
	for i := 0; i < r.cfg.clients; i++ {
		r.spawn()
	}
	started := time.Now()
	phase()
	r.finish()
	elapsed := time.Since(started)
	r.writeFaultLog()
	pd, perr := r.probe()
	rep := analyse(r)
	rep.elapsed = elapsed
	rep.probe, rep.probeErr = pd, perr
	if perr != nil {
		rep.violate("recovery", "final probe: no lock within %v after the faults stopped: %v", r.b.recover+slack, perr)
	}
	return rep
}

// writeFaultLog keeps the schedule beside the histories, for reading a
// failed run.
func (r *run) writeFaultLog() {
	var b strings.Builder
	for _, f := range r.faults {
		fmt.Fprintf(&b, "%s target=%d held=%v start=%d end=%d afterStart=%d afterEnd=%d %s\n",
			f.kind, f.target, f.targetHeld, f.start, f.end, f.afterStart, f.afterEnd, f.detail)
	}
	os.WriteFile(filepath.Join(r.work, "faults.log"), []byte(b.String()), 0o644)
}
