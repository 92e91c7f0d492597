//go:build linux

package chaos

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/ubgo/lock"
)

// hev is one line of a client's history file. Each is written with one
// write(2) once the step it describes has returned, so a client killed
// mid-step leaves no line for that step (the register's log still has its
// accesses).
type hev struct {
	K   string `json:"k"` // start, acq, rd, wr, done, relcall, rel
	CS  int    `json:"cs,omitempty"`
	T0  int64  `json:"t0,omitempty"` // call
	T1  int64  `json:"t1,omitempty"` // return (or the moment observed)
	Tok uint64 `json:"tok,omitempty"`
	PID int    `json:"pid,omitempty"` // start: the client's pid; acq: the backend session's pid (pglock)
	Sh  bool   `json:"sh,omitempty"`  // acq: a reader's (WithShared), in the shared workload
	Err string `json:"err,omitempty"`

	OK       bool  `json:"ok,omitempty"`       // rd/wr accepted by the fence
	V        int64 `json:"v,omitempty"`        // rd/wr value
	Locked   bool  `json:"locked,omitempty"`   // err matches lock.ErrLocked
	Canceled bool  `json:"canceled,omitempty"` // err matches context.Canceled
	Pre      bool  `json:"pre,omitempty"`      // acq: the ctx was cancelled before Acquire was called
	Lost     bool  `json:"lost,omitempty"`     // err (or, for done, Holder.Err) matches lock.ErrLockLost
	Closed   bool  `json:"closed,omitempty"`   // rel: Done was closed when Release returned
	HLost    bool  `json:"hlost,omitempty"`    // rel: Holder.Err matched ErrLockLost after Release
}

type history struct {
	mu sync.Mutex
	f  *os.File
}

func openHistory(path string) (*history, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	return &history{f: f}, nil
}

func (h *history) add(e hev) {
	b, _ := json.Marshal(e)
	h.mu.Lock()
	defer h.mu.Unlock()
	h.f.Write(append(b, '\n'))
}

func readHistory(path string) ([]hev, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var evs []hev
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var e hev
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			// A line torn by SIGKILL can only be the last one.
			continue
		}
		evs = append(evs, e)
	}
	return evs, sc.Err()
}

func historyPath(work string, client int) string {
	return filepath.Join(work, "client-"+strconv.Itoa(client)+".jsonl")
}

// pidHolder is a holder that can say which backend session holds it.
type pidHolder interface{ BackendPID() uint32 }

// client is one contender: a loop of acquire (waiting), fenced
// read-modify-write, release. In the shared workload two sections in three
// are a reader's instead: acquire shared, one fenced read, release.
type client struct {
	id     int
	name   string
	locker lock.Locker
	shared lock.Locker // WithShared, in the shared workload; else nil
	reg    *register
	hist   *history
	rng    *rand.Rand
	say    func(format string, args ...any) // progress lines for the parent
	work   time.Duration                    // longest pause inside a critical section
	hold   func()                           // if set, ends a section in place of its last pause (scripted)

	mu       sync.Mutex
	cancel   context.CancelFunc // of the Acquire in progress
	cancelAt int64              // when it was cancelled, 0 if not
}

// cancelWait cancels the Acquire in progress, if any: the fault "a waiter's
// ctx cancelled mid-wait".
func (c *client) cancelWait() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cancel != nil {
		if c.cancelAt == 0 {
			c.cancelAt = now()
		}
		c.cancel()
	}
}

func (c *client) run(stop <-chan struct{}) {
	for cs := 1; ; cs++ {
		select {
		case <-stop:
			return
		default:
		}
		c.section(cs, stop)
	}
}

// section is one turn of the loop: a waiting Acquire and, if it got the
// lock, the critical section. It reports whether it got the lock.
func (c *client) section(cs int, stop <-chan struct{}) bool {
	ctx, cancel := context.WithCancel(context.Background())
	c.mu.Lock()
	c.cancel, c.cancelAt = cancel, 0
	c.mu.Unlock()
	go func() {
		select {
		case <-stop:
			c.cancelWait()
		case <-ctx.Done():
		}
	}()
	c.say("wait")
	l, reader := c.locker, c.shared != nil && c.rng.IntN(3) > 0
	if reader {
		l = c.shared
	}
	t0 := now()
	h, err := l.Acquire(ctx, c.name)
	t1 := now()
	c.mu.Lock()
	c.cancel = nil
	// A ctx cancelled before Acquire was called: every backend answers
	// it with the bare ctx error, which the contract does not cover.
	pre := c.cancelAt != 0 && c.cancelAt <= t0
	c.mu.Unlock()
	// The holder must not depend on the Acquire context (design
	// pitfall: a session bound to it stops renewing when it ends).
	cancel()
	if err != nil {
		c.hist.add(hev{K: "acq", CS: cs, T0: t0, T1: t1, Err: err.Error(), Pre: pre, Sh: reader,
			Locked: errors.Is(err, lock.ErrLocked), Canceled: errors.Is(err, context.Canceled), Lost: errors.Is(err, lock.ErrLockLost)})
		if !errors.Is(err, context.Canceled) {
			// The server is down or unreachable: retry soon, but
			// do not spin.
			time.Sleep(time.Duration(20+c.rng.IntN(40)) * time.Millisecond)
		}
		return false
	}
	e := hev{K: "acq", CS: cs, T0: t0, T1: t1, Tok: h.Token(), Sh: reader}
	if p, ok := h.(pidHolder); ok {
		e.PID = int(p.BackendPID())
	}
	c.hist.add(e)
	c.say("held %d %d %d", h.Token(), t1, e.PID)
	c.critical(cs, h, reader)
	return true
}

// scripted is a client the parent drives (the paused-waiter test): each
// "acquire" line on cmds makes it take the lock, waiting (and trying
// again after a failure, as run does), and hold it after its fenced read
// and write until a "release" line. It returns when cmds is closed (its
// stdin ended).
func (c *client) scripted(cmds <-chan string, stop <-chan struct{}) {
	c.hold = func() {
		for cmd := range cmds {
			if cmd == "release" {
				return
			}
		}
	}
	cs := 0
	for cmd := range cmds {
		if cmd != "acquire" {
			continue
		}
		for {
			cs++
			if c.section(cs, stop) {
				break
			}
			select {
			case <-stop:
				return
			default:
			}
		}
	}
}

func (c *client) critical(cs int, h lock.Holder, reader bool) {
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		<-h.Done()
		t := now()
		err := h.Err()
		e := hev{K: "done", CS: cs, T1: t, Lost: errors.Is(err, lock.ErrLockLost)}
		if err != nil {
			e.Err = err.Error()
		}
		c.hist.add(e)
	}()
	tok := h.Token()
	t0 := now()
	kind := byte('R')
	if reader {
		kind = 'S'
	}
	ok, v, err := c.reg.access(cs, kind, tok, 0)
	c.hist.add(hev{K: "rd", CS: cs, T0: t0, T1: now(), Tok: tok, OK: ok, V: v, Err: errString(err)})
	if err == nil && ok && !reader {
		c.pause()
		t0 = now()
		wok, wv, err := c.reg.access(cs, 'W', tok, v+1)
		c.hist.add(hev{K: "wr", CS: cs, T0: t0, T1: now(), Tok: tok, OK: wok, V: wv, Err: errString(err)})
	}
	if c.hold != nil {
		c.hold()
	} else {
		c.pause()
	}
	t0 = now()
	// Said before the call: a client killed inside Release may already
	// have freed the lock, and its section ended here.
	c.hist.add(hev{K: "relcall", CS: cs, T0: t0})
	rerr := h.Release()
	t1 := now()
	closed := false
	select {
	case <-h.Done():
		closed = true
	default:
	}
	e := hev{K: "rel", CS: cs, T0: t0, T1: t1, Tok: tok, Err: errString(rerr), Lost: errors.Is(rerr, lock.ErrLockLost),
		Closed: closed, HLost: errors.Is(h.Err(), lock.ErrLockLost)}
	c.hist.add(e)
	c.say("free %d", t1)
	<-watched
}

func (c *client) pause() {
	if c.work > 0 {
		time.Sleep(time.Duration(c.rng.Int64N(int64(c.work))))
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// Environment of a client process.
const (
	envBackend = "CHAOS_BACKEND"
	envClient  = "CHAOS_CLIENT"
	envWork    = "CHAOS_WORK"
	envName    = "CHAOS_NAME"
	envSeed    = "CHAOS_SEED"
	envCSWork  = "CHAOS_CS_WORK"
	envScript  = "CHAOS_SCRIPT" // "1": the client is scripted by lines on its stdin
)

// childMain is a client process: it runs until its stdin closes, then
// finishes its critical section and exits. SIGUSR1 cancels its wait. A
// scripted client (CHAOS_SCRIPT=1) takes and releases the lock when the
// lines of its stdin say so.
func childMain() int {
	id, _ := strconv.Atoi(os.Getenv(envClient))
	seed, _ := strconv.ParseUint(os.Getenv(envSeed), 10, 64)
	work := os.Getenv(envWork)
	cswork, _ := time.ParseDuration(os.Getenv(envCSWork))
	b := backendByName(os.Getenv(envBackend))
	if b == nil {
		fmt.Fprintln(os.Stderr, "chaos: unknown backend", os.Getenv(envBackend))
		return 2
	}
	out := bufio.NewWriter(os.Stdout)
	var outMu sync.Mutex
	say := func(format string, args ...any) {
		outMu.Lock()
		defer outMu.Unlock()
		fmt.Fprintf(out, format+"\n", args...)
		out.Flush()
	}
	hist, err := openHistory(historyPath(work, id))
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		return 2
	}
	hist.add(hev{K: "start", PID: os.Getpid(), T1: now()})
	reg, err := openRegister(work, id)
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		return 2
	}
	mk, closeFn, err := b.client(os.Getenv)
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		return 2
	}
	c := &client{id: id, name: os.Getenv(envName), locker: mk(), shared: b.sharedLocker(mk), reg: reg, hist: hist,
		rng: rand.New(rand.NewPCG(seed, uint64(id))), say: say, work: cswork}
	stop := make(chan struct{})
	cmds := make(chan string, 8)
	go func() {
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			cmds <- sc.Text()
		}
		close(cmds)
		close(stop)
	}()
	usr := make(chan os.Signal, 4)
	signal.Notify(usr, syscall.SIGUSR1)
	go func() {
		for range usr {
			c.cancelWait()
		}
	}()
	say("ready")
	if os.Getenv(envScript) == "1" {
		c.scripted(cmds, stop)
	} else {
		c.run(stop)
	}
	closeFn()
	say("bye")
	return 0
}
