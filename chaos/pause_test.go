//go:build linux

package chaos

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ubgo/lock"
)

// The paused-waiter test (issue 29): a process paused while it waits for
// a lock must not hold it, once it runs again, while another does. Each
// round, on one name, with three scripted client processes:
//
//  1. the holder takes the name; the head waiter and then the next waiter
//     queue behind it (Acquire with WithWait; where the backend's Inspect
//     counts queued waiters, each is seen in the queue before the next
//     step);
//  2. the head is stopped (SIGSTOP) and the holder releases: a backend
//     that hands the name to the first waiter grants it to the paused
//     head;
//  3. the next waiter takes the name — on a lease backend once the
//     grant's lease ran out — and the head stays paused at least one
//     lease after the release;
//  4. the head continues (SIGCONT) while the next waiter keeps the name
//     pauseHold more; then the next releases and the head takes it.
//
// A session backend (pglock) keeps a grant its server made to the paused
// head's session: the next waiter then waits for the head instead, which
// is as correct. The run's histories go through every check of TestChaos,
// and each round's three sections must not overlap, with tokens rising in
// the order they were acquired. memlock is left out: its clients share
// one process, which no signal can pause in part.
//
// Rounds per backend: 20 in the long run, 3 in the short one, or
// CHAOS_ROUNDS (-chaos.rounds).

var roundsFlag = flag.Int("chaos.rounds", int(envUint("CHAOS_ROUNDS")), "rounds of the paused-waiter test per backend (0: 20 in the long run, 3 in the short one, 1 under -short)")

// pauseHold is how long the next waiter keeps the name after the head
// continued: time for a head that took a stale grant to say so.
const pauseHold = 2 * time.Second

// pauseTTL is the lease of the test's lease backends: short, so that a
// grant to the paused head runs out soon (etcd leases count whole
// seconds).
var pauseTTL = map[string]time.Duration{
	"filelock": 500 * time.Millisecond, "redislock": 500 * time.Millisecond, "etcdlock": time.Second,
}

// round is one round of the test, as the parent drove it.
type round struct {
	n                  int
	holder, head, next int      // client ids
	toks               []uint64 // tokens of the round's sections, in the order they were reported
	stop, rel, cont    int64    // head stopped, holder's release returned, head continued
	nextDuring         bool     // the next waiter acquired while the head was paused
	headFirst          bool     // the head acquired before the next waiter
	inGuard            int      // stops that landed inside filelock's guard (the head was continued and stopped again)
	err                string   // why the round did not complete
}

// TestPausedWaiter runs the rounds against every backend whose clients are
// processes.
func TestPausedWaiter(t *testing.T) {
	rounds := *roundsFlag
	if rounds <= 0 {
		rounds = 3
		switch {
		case *longFlag:
			rounds = 20
		case testing.Short():
			rounds = 1
		}
	}
	for _, b := range backends() {
		if b.mix || b.inProcess {
			continue
		}
		t.Run(b.name, func(t *testing.T) {
			cfg := runConfig{clients: 3, seed: config(b).seed, csWork: 4 * time.Millisecond}
			r := newRun(t, pauseDef(b), cfg)
			r.env = append(r.env, envScript+"=1")
			rep := r.execute(func() { r.pausePhase(rounds) })
			conclude(t, r, rep, "chaos-paused-")
		})
	}
}

// pauseDef is b with the test's lease, and the recovery bound that
// follows from it.
func pauseDef(b *backendDef) *backendDef {
	p := *b
	if d, ok := pauseTTL[b.name]; ok {
		p.recover += d - b.ttl
		p.ttl = d
	}
	return &p
}

// pausePhase runs the rounds, each client taking the three roles in turn,
// until one does not complete.
func (r *run) pausePhase(rounds int) {
	ps := r.live()
	started := func() bool {
		for _, p := range ps {
			if p.count("ready") == 0 {
				return false
			}
		}
		return true
	}
	if len(ps) != 3 || !r.await(time.Minute, 0, started, ps...) {
		r.setupErr(errors.New("paused-waiter: the three clients did not start within a minute"))
		return
	}
	mk, closeFn, err := r.b.client(r.getenv)
	if err != nil {
		r.setupErr(fmt.Errorf("paused-waiter: inspecting client: %w", err))
		return
	}
	defer closeFn()
	in, _ := mk().(lock.Inspector)
	for n := range rounds {
		rd := r.pauseRound(n, ps[n%3], ps[(n+1)%3], ps[(n+2)%3], in)
		r.mu.Lock()
		r.rounds = append(r.rounds, rd)
		r.mu.Unlock()
		if rd.err != "" {
			return
		}
	}
}

// pauseRound is one round: h holds, head and next queue, head is paused
// across the release.
func (r *run) pauseRound(n int, h, head, next *proc, in lock.Inspector) (rd round) {
	rd = round{n: n + 1, holder: h.id, head: head.id, next: next.id}
	long := r.b.recover + r.b.ttl + 2*slack
	if !r.take(h, long) {
		rd.err = fmt.Sprintf("the holder did not acquire within %v", long)
		return rd
	}
	rd.toks = append(rd.toks, h.token())
	for i, w := range []*proc{head, next} {
		if err := r.queue(w, in, i+1); err != nil {
			rd.err = err.Error()
			return rd
		}
	}
	held := map[*proc]int{head: head.count("held"), next: next.count("held")}
	defer func() {
		if rd.cont == 0 && rd.stop != 0 { // the round failed with the head stopped
			head.cmd.Process.Signal(syscall.SIGCONT)
			r.addStop(head.id, rd.stop, now())
		}
	}()
	if err := r.pauseHead(&rd, head); err != nil {
		rd.err = err.Error()
		return rd
	}
	if !r.release(h, long) {
		rd.err = fmt.Sprintf("the holder did not release within %v", long)
		return rd
	}
	rd.rel = now()
	if err := r.pausedRelease(&rd, head, next, held, in, long); err != nil {
		rd.err = err.Error()
	}
	return rd
}

// pausedRelease follows the holder's release: the next waiter takes the
// name while the head is paused (unless the server granted it to the
// head's session), the head continues, and the two take it in turn.
func (r *run) pausedRelease(rd *round, head, next *proc, held map[*proc]int, in lock.Inspector, long time.Duration) error {
	heldAgain := func(p *proc) bool { return p.count("held") > held[p] }
	r.await(long, 20*time.Millisecond, func() bool {
		return heldAgain(next) || (r.b.class == sessionExclusion && heldByAnyone(in, r.name))
	}, next)
	rd.nextDuring = heldAgain(next)
	if !rd.nextDuring && r.b.class != sessionExclusion {
		return fmt.Errorf("the next waiter did not acquire within %v of the release while the head was paused", long)
	}
	// The head stays paused past the lease of a grant made to it at the
	// release (the fault itself lasts that long: no event ends it).
	if rest := time.Duration(rd.rel + int64(r.b.ttl) - now()); rest > 0 {
		time.Sleep(rest)
	}
	head.cmd.Process.Signal(syscall.SIGCONT)
	rd.cont = now()
	r.addStop(head.id, rd.stop, rd.cont)
	first, second := next, head
	if !rd.nextDuring {
		if !r.await(long, 0, func() bool { return heldAgain(head) || heldAgain(next) }, head, next) {
			return fmt.Errorf("neither waiter acquired within %v of the head's resumption", long)
		}
		if heldAgain(head) {
			first, second = head, next
			rd.headFirst = true
		}
	}
	rd.toks = append(rd.toks, first.token())
	// The first keeps the name a while after the head resumed: a head
	// that took a stale grant says "held" meanwhile.
	time.Sleep(time.Duration(rd.cont + int64(pauseHold) - now()))
	if !r.release(first, long) {
		return fmt.Errorf("client %d did not release within %v", first.id, long)
	}
	if !r.await(long, 0, func() bool { return heldAgain(second) }, second) {
		return fmt.Errorf("client %d did not acquire within %v of client %d's release", second.id, long, first.id)
	}
	rd.toks = append(rd.toks, second.token())
	if !r.release(second, long) {
		return fmt.Errorf("client %d did not release within %v", second.id, long)
	}
	return nil
}

// pauseHead stops head (SIGSTOP) and returns once every thread of it is
// stopped. On filelock a stop that lands inside the name's guard blocks
// the name until the process continues (the guide says so): the head is
// then continued, and stopped again once it has left the guard.
func (r *run) pauseHead(rd *round, head *proc) error {
	pid, dir := head.cmd.Process.Pid, r.getenv("CHAOS_DIR")
	for try := 1; ; try++ {
		rd.stop = now()
		head.cmd.Process.Signal(syscall.SIGSTOP)
		if !r.await(5*time.Second, time.Millisecond, func() bool { return allStopped(pid) }, head) {
			return fmt.Errorf("client %d not stopped 5s after SIGSTOP", head.id)
		}
		if !r.b.guarded || !holdsFlockIn(pid, dir) {
			return nil
		}
		head.cmd.Process.Signal(syscall.SIGCONT)
		r.addStop(head.id, rd.stop, now())
		rd.stop = 0
		rd.inGuard++
		if try == 20 {
			return fmt.Errorf("client %d was inside the name's guard at each of 20 stops", head.id)
		}
		r.await(5*time.Second, time.Millisecond, func() bool { return !holdsFlockIn(pid, dir) }, head)
	}
}

// allStopped reports whether every thread of pid is stopped.
func allStopped(pid int) bool {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil || len(tasks) == 0 {
		return false
	}
	for _, t := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/stat", pid, t.Name()))
		if err != nil {
			return false
		}
		// The state follows the command name's closing parenthesis.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 || i+2 >= len(b) || (b[i+2] != 'T' && b[i+2] != 't') {
			return false
		}
	}
	return true
}

// holdsFlockIn reports whether pid holds a flock(2) on a file of dir
// (/proc/locks).
func holdsFlockIn(pid int, dir string) bool {
	inodes := map[uint64]bool{}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if info, err := e.Info(); err == nil {
			if st, ok := info.Sys().(*syscall.Stat_t); ok {
				inodes[st.Ino] = true
			}
		}
	}
	b, _ := os.ReadFile("/proc/locks")
	for _, line := range strings.Split(string(b), "\n") {
		// "1: FLOCK  ADVISORY  WRITE 1139 08:01:1234567 0 EOF"; a request
		// that waits has "->" after the number.
		f := strings.Fields(line)
		if len(f) < 6 || f[1] != "FLOCK" || f[4] != strconv.Itoa(pid) {
			continue
		}
		dev := strings.Split(f[5], ":")
		if ino, err := strconv.ParseUint(dev[len(dev)-1], 10, 64); err == nil && inodes[ino] {
			return true
		}
	}
	return false
}

// heldByAnyone reports whether in sees name held.
func heldByAnyone(in lock.Inspector, name string) bool {
	if in == nil {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	info, err := in.Inspect(ctx, name)
	return err == nil && len(info.Holders) > 0
}

// send writes one command line to a scripted client.
func (r *run) send(p *proc, cmd string) {
	if _, err := fmt.Fprintln(p.stdin, cmd); err != nil {
		r.setupErr(fmt.Errorf("client %d: %s: %w", p.id, cmd, err))
	}
}

// take has p acquire the name and waits (up to d) until it holds it.
func (r *run) take(p *proc, d time.Duration) bool {
	n := p.count("held")
	r.send(p, "acquire")
	return r.await(d, 0, func() bool { return p.count("held") > n }, p)
}

// release has p release the name and waits (up to d) until it has.
func (r *run) release(p *proc, d time.Duration) bool {
	n := p.count("free")
	r.send(p, "release")
	return r.await(d, 0, func() bool { return p.count("free") > n }, p)
}

// queue has p wait for the name, and returns once its Acquire is called
// and, where the backend's Inspect counts queued waiters, once it counts
// ahead (the waiters queued before p, p included).
func (r *run) queue(p *proc, in lock.Inspector, ahead int) error {
	n := p.count("wait")
	r.send(p, "acquire")
	if !r.await(10*time.Second, 0, func() bool { return p.count("wait") > n }, p) {
		return fmt.Errorf("client %d did not start waiting within 10s", p.id)
	}
	if !r.b.queueSeen || in == nil {
		return nil
	}
	var last lock.Info
	var lastErr error
	queued := func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		last, lastErr = in.Inspect(ctx, r.name)
		return lastErr == nil && last.Waiting >= ahead
	}
	if !r.await(10*time.Second, 5*time.Millisecond, queued, p) {
		return fmt.Errorf("client %d not seen queued within 10s (Inspect: %d waiting, %v)", p.id, last.Waiting, lastErr)
	}
	return nil
}

// checkRounds: in each round of the paused-waiter test, nobody held the
// name while another did (not the head while the next waiter held it),
// and tokens rose in the order the sections were acquired.
func checkRounds(rep *report, r *run, all []*csec) {
	byTok := map[uint64]*csec{}
	for _, c := range all {
		byTok[c.tok] = c
	}
	rep.paused = true
	for _, rd := range r.rounds {
		if rd.cont != 0 || rd.stop != 0 {
			rep.faults[fStopWait]++
		}
		if rd.err != "" {
			rep.violate("paused-waiter", "round %d (holder %d, head %d, next %d): %s", rd.n, rd.holder, rd.head, rd.next, rd.err)
			continue
		}
		rep.rounds++
		rep.roundsInGuard += rd.inGuard
		if rd.nextDuring {
			rep.roundsNext++
		}
		if rd.headFirst {
			rep.roundsHead++
		}
		var secs []*csec
		for _, tok := range rd.toks {
			if c := byTok[tok]; c != nil {
				secs = append(secs, c)
			} else {
				rep.violate("paused-waiter", "round %d: no section has token %d", rd.n, tok)
			}
		}
		sortByAcquire(secs)
		for i, a := range secs {
			for _, b := range secs[i+1:] {
				if a.acq1 < b.end && b.acq1 < a.end {
					rep.roundOverlaps++
					rep.violate("paused-waiter", "round %d (head: client %d, paused %s..%s): %v and %v held the name together",
						rd.n, rd.head, ms(rd.stop), ms(rd.cont), a, b)
				}
			}
			if i > 0 && a.tok <= secs[i-1].tok {
				rep.violate("token", "round %d: %v acquired after %v with a token not above its", rd.n, a, secs[i-1])
			}
		}
	}
}
