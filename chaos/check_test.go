//go:build linux

package chaos

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

// csec is one critical section: from the moment Acquire returned to the
// moment Release was called (or the client was killed).
type csec struct {
	client, cs int
	tok        uint64
	pid        int
	shared     bool // a reader's (shared workload)
	acq0, acq1 int64
	rel0, rel1 int64
	relCall    int64 // when Release was called, even if it never returned
	hasRel     bool
	relLost    bool // Release returned ErrLockLost
	hasRelErr  bool // Release returned an error
	relErr     string
	closed     bool // Done was closed when Release returned
	hlost      bool // Err matched ErrLockLost after Release
	done       int64
	doneLost   bool
	killed     bool
	stopped    bool // SIGSTOP'd while it held the lock
	end        int64
	rd, wr     *hev
	ops        []regOp // its accesses, from the register's log
}

func (c *csec) lost() bool { return c.doneLost || c.relLost || c.hlost }

func (c *csec) String() string {
	return fmt.Sprintf("client %d cs %d token %d [%s..%s]", c.client, c.cs, c.tok, ms(c.acq1), ms(c.end))
}

// epoch is the first client's start in the run being analysed: times in
// violation messages are relative to it.
var epoch int64

func ms(t int64) string { return fmt.Sprintf("%.3fs", float64(t-epoch)/1e9) }

type report struct {
	backend  string
	class    exclusion
	seed     uint64
	elapsed  time.Duration
	clients  int
	sections int // critical sections
	accesses int // register accesses
	acquires int // Acquire calls
	canceled int // Acquire calls that returned ctx cancelled
	acqErrs  int // Acquire calls that failed otherwise
	faults   map[string]int

	violations   []string
	known        []string // violations of known, reported issues (see main_test.go)
	staleRead    int      // reads refused by the fence
	staleWrite   int      // writes refused by the fence
	overlaps     int      // pairs of overlapping sections, all explained by a loss
	mix          bool     // the shared workload
	readers      int      // readers' sections (shared workload)
	together     int      // pairs of readers' sections that overlapped, neither lost
	stale        int      // sections overlapped by a successor
	lostHolders  int      // holders that lost their lock (by evidence)
	sawDone      int      // of which Done was closed when their Release returned
	maxUnavail   time.Duration
	maxRecover   time.Duration
	maxLag       time.Duration // loss told to a holder after its successor acquired (lease backends, not stopped)
	linearizable string
	paused       bool // the paused-waiter test
	rounds       int  // paused-waiter rounds completed
	roundsNext   int  // of which the next waiter acquired while the head was paused
	roundsHead   int  // of which the head acquired first (a session backend's server granted it)
	// stops of a paused-waiter round that landed inside filelock's guard
	roundsInGuard int
	// sections of a paused-waiter round that held the name together (pairs)
	roundOverlaps int
	final         int64
	probe         time.Duration
	probeErr      error
}

func (r *report) violate(kind, format string, args ...any) {
	r.violations = append(r.violations, kind+": "+fmt.Sprintf(format, args...))
}

// analyse reads the histories and the register's log of a finished run and
// checks the guarantees.
func analyse(r *run) *report {
	rep := &report{backend: r.b.name, class: r.b.class, seed: r.cfg.seed, clients: r.nextID, faults: map[string]int{}, mix: r.b.mix}
	epoch = 0
	for _, f := range r.faults {
		if !f.skipped {
			rep.faults[f.kind]++
		}
	}
	for _, c := range r.crashes {
		rep.violate("crash", "%s", c)
	}
	for _, h := range r.hung {
		rep.violate("hung", "%s", h)
	}
	ops, err := readRegisterLog(r.work)
	if err != nil {
		rep.violate("register", "%v", err)
		return rep
	}
	var runEnd int64 = now()

	// Critical sections from the histories.
	secs := map[[2]int]*csec{}
	lastSeen := map[int]int64{}
	for id := 0; id < r.nextID; id++ {
		evs, err := readHistory(historyPath(r.work, id))
		if err != nil {
			rep.violate("history", "client %d: %v", id, err)
			continue
		}
		for i := range evs {
			e := &evs[i]
			lastSeen[id] = max(lastSeen[id], e.T0, e.T1)
			if e.K == "start" {
				if epoch == 0 || e.T1 < epoch {
					epoch = e.T1
				}
				continue
			}
			if e.K == "acq" {
				rep.acquires++
				switch {
				case e.Err == "":
				case e.Canceled:
					rep.canceled++
					// A wait whose backend failed under it returns that
					// failure, not ErrLocked (an outage is not contention).
					if !e.Locked && !e.Pre && !r.outageDuring(e.T0, e.T1) {
						rep.violate("cancel", "client %d: a cancelled wait returned %q, which does not match ErrLocked", id, e.Err)
					}
					continue
				default:
					rep.acqErrs++
					continue
				}
			}
			k := [2]int{id, e.CS}
			c := secs[k]
			if c == nil {
				c = &csec{client: id, cs: e.CS}
				secs[k] = c
			}
			switch e.K {
			case "acq":
				c.tok, c.pid, c.acq0, c.acq1, c.shared = e.Tok, e.PID, e.T0, e.T1, e.Sh
			case "rd":
				c.rd = e
			case "wr":
				c.wr = e
			case "done":
				c.done, c.doneLost = e.T1, e.Lost
			case "relcall":
				c.relCall = e.T0
			case "rel":
				c.hasRel, c.rel0, c.rel1 = true, e.T0, e.T1
				c.relLost, c.closed, c.hlost = e.Lost, e.Closed, e.HLost
				c.hasRelErr, c.relErr = e.Err != "", e.Err
			}
		}
	}
	for _, op := range ops {
		if c := secs[[2]int{op.Client, op.CS}]; c != nil {
			c.ops = append(c.ops, op)
			lastSeen[op.Client] = max(lastSeen[op.Client], op.T)
		} else {
			rep.violate("register", "access by client %d cs %d that no acquire explains", op.Client, op.CS)
		}
	}
	var all []*csec
	for _, c := range secs {
		if c.acq1 == 0 {
			continue // a done or rel line without its acq: cannot happen
		}
		kill, killed := r.kills[c.client]
		switch {
		case c.hasRel:
			c.end = c.rel0
		case c.relCall != 0:
			c.end, c.killed = c.relCall, killed
		case killed:
			c.killed, c.end = true, max(kill, lastSeen[c.client])
		default:
			c.end = runEnd
		}
		for _, s := range r.stops[c.client] {
			if s.from < c.end && s.to > c.acq1 {
				c.stopped = true
			}
		}
		all = append(all, c)
	}
	sortByAcquire(all)
	rep.sections = len(all)
	rep.accesses = len(ops)

	if r.b.mix {
		checkShared(rep, all)
	}
	checkRegister(rep, ops)
	checkTokens(rep, all)
	checkOverlaps(rep, r, all)
	checkStaleGrants(rep, r, all)
	checkLossSeen(rep, r, all)
	checkRecovery(rep, r)
	checkLinearizable(rep, all)
	if len(r.rounds) > 0 {
		checkRounds(rep, r, all)
	}
	return rep
}

// sortByAcquire sorts sections by the return of their Acquire.
func sortByAcquire(secs []*csec) {
	sort.Slice(secs, func(i, j int) bool { return secs[i].acq1 < secs[j].acq1 })
}

// checkShared: in the shared workload readers held the name together,
// neither of them having lost it (else a backend taking WithShared as an
// exclusive lock would pass).
// That no writer overlapped anyone is checkOverlaps's.
func checkShared(rep *report, all []*csec) {
	for i, a := range all {
		if !a.shared {
			continue
		}
		rep.readers++
		for _, b := range all[i+1:] {
			if b.acq1 >= a.end {
				break
			}
			// A section that lost its lock may overlap any other.
			if b.shared && !a.lost() && !b.lost() && !a.killed && !b.killed && !a.stopped && !b.stopped {
				rep.together++
			}
		}
	}
	if rep.together == 0 {
		rep.violate("shared", "no two of %d readers' sections held the name together", rep.readers)
	}
}

// checkRegister: the fence never accepted a token lower than one it had
// accepted (check 1), and no accepted write lost another's update (check
// 3): each wrote the value it replaced plus one.
func checkRegister(rep *report, ops []regOp) {
	var highest, highestW uint64
	var value, writes int64
	reads := map[[2]int]int64{}
	for _, op := range ops {
		ok := fenceAccepts(op.Kind, op.Token, highest, highestW)
		if ok != op.OK {
			rep.violate("fence", "access %d (%c): token %d against highest %d (a writer's %d): accepted=%v", op.Seq, op.Kind, op.Token, highest, highestW, op.OK)
		}
		if !op.OK {
			if op.Kind == 'W' {
				rep.staleWrite++
			} else {
				rep.staleRead++
			}
			continue
		}
		if op.Kind == 'S' {
			if op.Token < highestW {
				rep.violate("fence", "reader's access %d accepted token %d below a writer's %d", op.Seq, op.Token, highestW)
			}
			highest = max(highest, op.Token)
			continue
		}
		if op.Token < highest {
			rep.violate("fence", "access %d accepted token %d below %d", op.Seq, op.Token, highest)
		}
		highest, highestW = op.Token, op.Token
		switch op.Kind {
		case 'R':
			reads[[2]int{op.Client, op.CS}] = op.Value
		case 'W':
			writes++
			if op.Arg != value+1 {
				rep.violate("lost-update", "access %d (client %d cs %d token %d) wrote %d over %d", op.Seq, op.Client, op.CS, op.Token, op.Arg, value)
			}
			if rv, ok := reads[[2]int{op.Client, op.CS}]; !ok || rv+1 != op.Arg {
				rep.violate("lost-update", "access %d wrote %d, not its read %d plus one", op.Seq, op.Arg, rv)
			}
			value = op.Arg
		}
	}
	if value != writes {
		rep.violate("lost-update", "register holds %d after %d accepted increments", value, writes)
	}
	rep.final = value
}

// checkTokens: tokens are unique per acquisition and larger than those of
// every holder that had released before the acquire began — in the shared
// workload, where a writer is one of the two (readers' tokens are in no
// order among themselves).
func checkTokens(rep *report, all []*csec) {
	byTok := map[uint64]*csec{}
	for _, c := range all {
		if c.tok == 0 {
			rep.violate("token", "%v: token 0", c)
		}
		if o := byTok[c.tok]; o != nil {
			rep.violate("token", "%v and %v share a token", o, c)
		}
		byTok[c.tok] = c
	}
	// A released (or died) before B asked: B's token must be larger.
	ended := slices.Clone(all)
	relAt := func(c *csec) int64 {
		if c.hasRel {
			return c.rel1
		}
		return c.end
	}
	sort.Slice(ended, func(i, j int) bool { return relAt(ended[i]) < relAt(ended[j]) })
	byCall := slices.Clone(all)
	sort.Slice(byCall, func(i, j int) bool { return byCall[i].acq0 < byCall[j].acq0 })
	var best, bestW *csec // of every section, of writers'
	i := 0
	for _, b := range byCall {
		for i < len(ended) && relAt(ended[i]) < b.acq0 {
			e := ended[i]
			if best == nil || e.tok > best.tok {
				best = e
			}
			if !e.shared && (bestW == nil || e.tok > bestW.tok) {
				bestW = e
			}
			i++
		}
		than := best
		if b.shared {
			than = bestW
		}
		if than != nil && b.tok <= than.tok {
			rep.violate("token", "%v got a token not above %v, which had released before it asked", b, than)
		}
	}
}

// overlapping returns every pair of critical sections whose intervals
// overlap, the one with the smaller token first: the stale one, whichever
// Acquire returned first (a holder can lose its lock before its Acquire
// even returns).
// Two readers' sections (shared workload) may overlap: they are not
// returned.
func overlapping(all []*csec) [][2]*csec {
	var pairs [][2]*csec
	for i, a := range all {
		for _, b := range all[i+1:] {
			if b.acq1 >= a.end {
				break
			}
			if a.shared && b.shared {
				continue
			}
			if b.tok < a.tok {
				pairs = append(pairs, [2]*csec{b, a})
			} else {
				pairs = append(pairs, [2]*csec{a, b})
			}
		}
	}
	return pairs
}

// checkOverlaps is check 2: which critical sections overlapped, and
// whether the backend's promise explains it.
func checkOverlaps(rep *report, r *run, all []*csec) {
	stale := map[*csec]bool{}
	for _, p := range overlapping(all) {
		a, b := p[0], p[1]
		if r.b.class == kernelExclusion {
			rep.violate("overlap", "%v and %v overlap", a, b)
			continue
		}
		if !a.lost() && !(a.killed && a.stopped) {
			rep.violate("overlap", "%v and %v overlap, and the first (smaller token) never learned it had lost the lock", a, b)
			continue
		}
		rep.overlaps++
		stale[a] = true
		// The fence: nothing a did after b's first access was accepted.
		if len(b.ops) > 0 {
			first := b.ops[0].Seq
			for _, op := range a.ops {
				if op.Seq > first && op.OK {
					rep.violate("fence", "%v: access %d accepted after its successor's access %d", a, op.Seq, first)
				}
			}
		}
		// A lease holder that was running is told before its lease can
		// run out, so before a successor can acquire.
		if r.b.class == leaseExclusion && !a.stopped && !a.killed && a.done != 0 && b.acq1 > a.acq1 {
			rep.maxLag = max(rep.maxLag, time.Duration(a.done-b.acq1))
		}
	}
	rep.stale = len(stale)
}

// checkStaleGrants is the other half of check 2: an Acquire returns a
// lock its process holds, as far as that process could know. A section
// whose Acquire returned after a successor with a larger token had
// acquired (the name had passed on before the lock was returned) is a
// violation, unless its process could not know: it was paused (SIGSTOP)
// during the call at a moment when it may already have been granted the
// name, or a fault of the service (restart, drop, stall, terminate, loss)
// overlapped the call. A pause does not excuse it when, as it began,
// another process held the name firmly (its Acquire had returned, it was
// never stopped, killed or told of a loss while it held, and it held on
// past that moment): the grant then came after the pause began, so the
// process, running again, had to ask before taking it. Whether it was
// excused or not, check 2 has also judged the pair (the stale section
// learned of its loss, and the fence refused it).
func checkStaleGrants(rep *report, r *run, all []*csec) {
	if r.b.class == kernelExclusion {
		return // every overlap is a violation already
	}
	for _, p := range overlapping(all) {
		a, b := p[0], p[1]
		if b.acq1 >= a.acq1 || r.serviceFaultDuring(a.acq0, a.acq1) || pausedGranted(r, a, all) {
			continue
		}
		why := "it was not paused during its Acquire"
		if len(r.stops[a.client]) > 0 {
			why = "each pause during its Acquire began while another held the name"
		}
		rep.violate("stale-grant", "%v: Acquire returned at %s, after %v had acquired (its token larger) at %s; %s, so it could have known",
			a, ms(a.acq1), b, ms(b.acq1), why)
	}
}

// pausedGranted reports whether a's process was paused during a's
// Acquire at a moment when a may already have been granted the name: no
// other section held it firmly as the pause began (a's section excepted;
// a reader's section does not exclude a reader's grant).
func pausedGranted(r *run, a *csec, all []*csec) bool {
	for _, s := range r.stops[a.client] {
		if s.from >= a.acq1 || s.to <= a.acq0 {
			continue
		}
		firm := false
		for _, c := range all {
			if c == a || c.client == a.client || (c.shared && a.shared) {
				continue
			}
			if c.acq1 <= s.from && s.from < c.end && !c.lost() && !c.killed && !c.stopped {
				firm = true
				break
			}
		}
		if !firm {
			return true
		}
	}
	return false
}

// checkLossSeen is check 5: every holder that lost its lock (a successor
// with a larger token overlapped it, or its session was ended under it)
// saw Done closed, with Err matching ErrLockLost: by the time its Release
// returned, or — when Release itself failed, leaving the outcome unknown —
// afterwards.
func checkLossSeen(rep *report, r *run, all []*csec) {
	lost := map[*csec]string{}
	for _, p := range overlapping(all) {
		if !p[0].killed {
			lost[p[0]] = fmt.Sprintf("overlapped by %v", p[1])
		}
	}
	if r.b.class == sessionExclusion {
		for _, f := range r.faults {
			if f.kind != fTerminate && f.kind != fDrop {
				continue
			}
			for _, c := range all {
				if c.killed || c.acq1 >= f.start || !c.hasRel || c.rel0 <= f.end {
					continue
				}
				if f.kind == fTerminate && (c.pid == 0 || !strings.HasPrefix(f.detail, fmt.Sprintf("pid %d: 1 terminated", c.pid))) {
					continue
				}
				lost[c] = "its session was ended by " + f.kind
			}
		}
	}
	for _, c := range all {
		if _, ok := lost[c]; !ok && c.lost() && !c.killed {
			lost[c] = "it said so"
		}
	}
	rep.lostHolders = len(lost)
	for c, why := range lost {
		switch {
		case !c.hasRel:
			continue // the run ended before it released
		case c.closed && c.hlost:
			rep.sawDone++
		case c.rel1 != 0 && !c.relLost && c.hasRelErr && c.doneLost:
			rep.sawDone++ // Release failed; Done closed with the loss later
		default:
			rep.violate("done", "%v lost its lock (%s) but when Release returned (err %v) Done closed=%v, Err lost=%v; later Done lost=%v",
				c, why, c.relErr, c.closed, c.hlost, c.doneLost)
		}
	}
}

// checkRecovery is check 4: after each fault ended, someone acquired the
// lock within the documented bound.
func checkRecovery(rep *report, r *run) {
	bound := r.b.recover + slack
	for _, f := range r.faults {
		if f.skipped {
			continue
		}
		if f.afterStart != 0 {
			rep.maxUnavail = max(rep.maxUnavail, time.Duration(f.afterStart-f.start))
		}
		if f.afterEnd == 0 {
			rep.violate("recovery", "no acquire within %v after %s (target %d, %s) ended at %s", bound+2*time.Second, f.kind, f.target, f.detail, ms(f.end))
			continue
		}
		d := time.Duration(f.afterEnd - f.end)
		rep.maxRecover = max(rep.maxRecover, d)
		if d > bound {
			rep.violate("recovery", "%v until the next acquire after %s ended (bound %v)", d, f.kind, bound)
		}
	}
}

// The register, seen one critical section at a time: with fencing, each
// section is one atomic step — a read-increment-write, a read alone, or
// nothing when the fence refused its read.
type csIn struct {
	tok    uint64
	shared bool // a reader's: a read alone, fenced by writers' tokens
}
type csOut struct {
	readOK  bool
	readV   int64
	wroteOK bool
}
type regState struct {
	value    int64
	highest  uint64
	highestW uint64 // of writers' sections
}

var csModel = porcupine.Model{
	Init: func() any { return regState{} },
	Step: func(state, input, output any) (bool, any) {
		s, in, out := state.(regState), input.(csIn), output.(csOut)
		if in.shared {
			if !out.readOK {
				return in.tok < s.highestW, s
			}
			if in.tok < s.highestW || s.value != out.readV {
				return false, s
			}
			s.highest = max(s.highest, in.tok)
			return true, s
		}
		if !out.readOK {
			return in.tok < s.highest, s
		}
		if in.tok < s.highest || s.value != out.readV {
			return false, s
		}
		s.highest, s.highestW = in.tok, in.tok
		if out.wroteOK {
			s.value++
		}
		return true, s
	},
	DescribeOperation: func(input, output any) string {
		in, out := input.(csIn), output.(csOut)
		if in.shared {
			return fmt.Sprintf("shared cs(tok %d) read %v/%d", in.tok, out.readOK, out.readV)
		}
		return fmt.Sprintf("cs(tok %d) read %v/%d wrote %v", in.tok, out.readOK, out.readV, out.wroteOK)
	},
}

// checkLinearizable is the second half of check 1: porcupine finds the
// register's history, as the clients saw it in real time, linearizable.
func checkLinearizable(rep *report, all []*csec) {
	var hist []porcupine.Operation
	for _, c := range all {
		if len(c.ops) == 0 {
			continue
		}
		var out csOut
		var last int64
		for _, op := range c.ops {
			last = max(last, op.T)
			switch op.Kind {
			case 'R', 'S':
				out.readOK, out.readV = op.OK, op.Value
			case 'W':
				out.wroteOK = op.OK
			}
		}
		call := c.acq1
		if c.rd != nil {
			call = c.rd.T0
		}
		ret := c.end
		switch {
		case c.wr != nil:
			ret = c.wr.T1
		case c.rd != nil && len(c.ops) == 1:
			ret = c.rd.T1
		}
		ret = max(ret, last) // a killed client's last access
		hist = append(hist, porcupine.Operation{ClientId: c.client, Input: csIn{c.tok, c.shared}, Output: out, Call: call, Return: ret})
	}
	res := porcupine.CheckOperationsTimeout(csModel, hist, 60*time.Second)
	rep.linearizable = string(res)
	if res == porcupine.Illegal {
		rep.violate("linearizability", "porcupine: the register's history of %d sections is not linearizable", len(hist))
	}
}

// print writes the backend's table.
func (rep *report) print(w io.Writer) {
	fmt.Fprintf(w, "\n%s (seed %d, %v, %d client processes over the run, exclusion: %s)\n", rep.backend, rep.seed, rep.elapsed.Round(time.Second), rep.clients, rep.class)
	fmt.Fprintf(w, "| metric | value |\n|---|---|\n")
	fmt.Fprintf(w, "| operations | %d acquires (%d critical sections, %d waits cancelled, %d errors), %d register accesses |\n", rep.acquires, rep.sections, rep.canceled, rep.acqErrs, rep.accesses)
	if rep.mix {
		fmt.Fprintf(w, "| readers' sections / pairs of them held together | %d / %d |\n", rep.readers, rep.together)
	}
	fmt.Fprintf(w, "| faults | %s |\n", rep.faultList())
	fmt.Fprintf(w, "| violations | %s |\n", rep.violationCount())
	fmt.Fprintf(w, "| stale accesses rejected by the fence | %d writes, %d reads |\n", rep.staleWrite, rep.staleRead)
	fmt.Fprintf(w, "| sections overlapped by a successor (pairs), all after a loss | %d (%d) |\n", rep.stale, rep.overlaps)
	if rep.class == leaseExclusion {
		fmt.Fprintf(w, "| latest loss notice after the successor acquired (running holders; 0 = always before) | %v |\n", rep.maxLag.Round(time.Millisecond))
	}
	fmt.Fprintf(w, "| holders that lost the lock / saw Done close | %d / %d |\n", rep.lostHolders, rep.sawDone)
	if rep.paused {
		fmt.Fprintf(w, "| paused-waiter rounds completed / next waiter acquired during the pause / head acquired first / pairs that held together | %d / %d / %d / %d |\n",
			rep.rounds, rep.roundsNext, rep.roundsHead, rep.roundOverlaps)
		if rep.roundsInGuard > 0 {
			fmt.Fprintf(w, "| pauses that landed inside the name's guard (the name blocked, as documented; the head continued and stopped again) | %d |\n", rep.roundsInGuard)
		}
	}
	fmt.Fprintf(w, "| longest unavailability after a fault | %v |\n", rep.maxUnavail.Round(time.Millisecond))
	fmt.Fprintf(w, "| longest recovery after a fault ended (bound) | %v (%v) |\n", rep.maxRecover.Round(time.Millisecond), (backendByName(rep.backend).recover + slack))
	fmt.Fprintf(w, "| final probe acquired in | %v |\n", rep.probe.Round(time.Millisecond))
	fmt.Fprintf(w, "| register value / porcupine | %d / %s |\n", rep.final, rep.linearizable)
	for _, v := range rep.violations {
		fmt.Fprintf(w, "VIOLATION %s\n", v)
	}
}

func (rep *report) violationCount() string {
	s := strconv.Itoa(len(rep.violations))
	if len(rep.known) > 0 {
		s += fmt.Sprintf(" (and %d of a known issue, see docs/design/chaos.md, Findings)", len(rep.known))
	}
	return s
}

// printSummary writes one line per backend.
func printSummary(w io.Writer, reps []*report) {
	fmt.Fprintf(w, "\nsummary (seed %d)\n", reps[0].seed)
	fmt.Fprintf(w, "| backend | operations: acquires / register accesses | faults injected | violations | stale accesses rejected | longest unavailability after a fault | longest recovery after a fault ended (bound) |\n")
	fmt.Fprintf(w, "|---|---|---|---|---|---|---|\n")
	for _, r := range reps {
		fmt.Fprintf(w, "| %s | %d / %d | %s | %s | %d | %v | %v (%v) |\n", r.backend, r.acquires, r.accesses, r.faultList(),
			r.violationCount(), r.staleRead+r.staleWrite, r.maxUnavail.Round(time.Millisecond), r.maxRecover.Round(time.Millisecond),
			backendByName(r.backend).recover+slack)
	}
}

func (rep *report) faultList() string {
	var parts []string
	total := 0
	for _, k := range slices.Sorted(maps.Keys(rep.faults)) {
		parts = append(parts, fmt.Sprintf("%s %d", k, rep.faults[k]))
		total += rep.faults[k]
	}
	return fmt.Sprintf("%d: %s", total, strings.Join(parts, ", "))
}

// serviceFaultDuring reports whether a fault that may take a lock from
// its holder without its process knowing — an outage (see outageDuring),
// an ended session, a forced loss — overlapped [t0, t1].
func (r *run) serviceFaultDuring(t0, t1 int64) bool {
	for _, f := range r.faults {
		if (f.kind == fTerminate || f.kind == fLoss) && !f.skipped && f.start <= t1 && f.end >= t0 {
			return true
		}
	}
	return r.outageDuring(t0, t1)
}

// outageDuring reports whether a fault of the whole service (a restart, or
// the proxy dropping or stalling every connection) overlapped [t0, t1].
func (r *run) outageDuring(t0, t1 int64) bool {
	for _, f := range r.faults {
		if (f.kind == fRestart || f.kind == fDrop || f.kind == fStall) && !f.skipped && f.start <= t1 && f.end >= t0 {
			return true
		}
	}
	return false
}
