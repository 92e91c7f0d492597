//go:build linux

package chaos

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"time"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/contrib/gocronlock"
	"github.com/ubgo/lock/internal/testenv"
)

// mxCall is one run of a cell.
type mxCall struct {
	m       *mx
	c       mxCell
	name    string
	app     string // B's application_name (how pglock's sessions of B are found)
	a, b    *mxFactory
	held    []lock.Holder // A's
	t0      time.Time     // B's call began
	healed  bool
	quit    chan struct{}
	struck  <-chan struct{} // closed once an armed fault will not strike any more
	closers []func()
}

// mxResult is how B's call ended.
type mxResult struct {
	err  error
	took time.Duration
}

// mxExit is the exit of a lock run.
type mxExit struct {
	code   int
	stderr string
}

func (e *mxExit) Error() string { return fmt.Sprintf("exit %d: %s", e.code, e.stderr) }

func (e *mxExit) Is(target error) bool { return e.code == 1 && target == lock.ErrLocked }

// mxClass is the error class of B's call.
func mxClass(err error) string {
	var ex *mxExit
	switch {
	case err == nil:
		return "acquired"
	case errors.Is(err, lock.ErrLocked):
		return "locked"
	case errors.As(err, &ex) && ex.code != 69:
		return fmt.Sprintf("exit %d", ex.code)
	}
	return "outage"
}

// runCell runs cell c once and checks it.
func (m *mx) runCell(c mxCell) (o mxOutcome) {
	o.bound = c.bound()
	m.seq++
	k := &mxCall{m: m, c: c, quit: make(chan struct{}),
		name: fmt.Sprintf("%s-%s-%s-%s-%d", c.kind, c.fault, c.when, c.mode, m.seq), app: fmt.Sprintf("chaos-b-%d", m.seq)}
	defer k.close()
	if err := k.prepare(); err != nil {
		k.heal()
		o.fail("set-up: %v", err)
		return o
	}
	r, note := k.strike()
	if err := k.heal(); err != nil {
		o.fail("the store did not come back: %v", err)
		return o
	}
	o.took, o.class = r.took, mxClass(r.err)
	if r.err != nil {
		o.err = r.err.Error()
	}
	if note != "" {
		o.fail("%s", note)
	}
	if o.took > o.bound {
		o.fail("returned after %v, past its bound %v", o.took.Round(time.Millisecond), o.bound)
	}
	if o.class != c.want() {
		o.fail("%s, want %s", o.class, c.want())
	}
	if o.class == "outage" && !strings.Contains(o.err, c.backend) {
		o.note("the error does not name " + c.backend)
	}
	k.after(&o)
	return o
}

// prepare makes A's and B's factories; A takes what B will ask for
// (not on a round trip, which finds the name free), and on a round trip
// B first takes another name, so that its connections are open.
func (k *mxCall) prepare() (err error) {
	if k.a, err = k.factory(k.m.addr, "chaos-a", false); err != nil {
		return err
	}
	if k.c.kind == "run" {
		if _, err := k.m.bin.get(); err != nil {
			return err
		}
	} else if k.b, err = k.factory(k.m.p.addr(), k.app, true); err != nil {
		return err
	}
	if k.c.when != "trip" {
		k.held, err = k.take(k.a, 5*time.Second, false, nil, k.heldNames()...)
		return err
	}
	// The same options as the call: the same statements and scripts,
	// prepared and loaded.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	h, err := k.b.as(k.opts()...).Acquire(ctx, "warm-"+k.name)
	if err == nil {
		h.Release()
	}
	return err
}

// opts are the options of B's Acquire.
func (k *mxCall) opts() []lock.Option {
	var opts []lock.Option
	switch k.c.mode {
	case "wait":
		opts = append(opts, lock.WithWait())
	case "waittimeout":
		opts = append(opts, lock.WithWaitTimeout(k.c.deadline()))
	}
	switch k.c.kind {
	case "shared":
		opts = append(opts, lock.WithShared())
	case "semaphore":
		opts = append(opts, lock.WithMaxConcurrent(2))
	}
	return opts
}

func (k *mxCall) factory(addr, app string, b bool) (*mxFactory, error) {
	f, err := k.m.factory(addr, app, b)
	if err == nil {
		k.closers = append(k.closers, f.close)
	}
	return f, err
}

// names are the names B asks for; heldNames what A holds of them (the
// second of AcquireAll's two: B takes the first, then waits).
func (k *mxCall) names() []string {
	if k.c.kind == "all" {
		return []string{k.name + "-a", k.name + "-b"}
	}
	return []string{k.name}
}

func (k *mxCall) heldNames() []string { n := k.names(); return n[len(n)-1:] }

// strike runs B's call with the fault at its moment, and returns how it
// ended and what went wrong on the way.
func (k *mxCall) strike() (mxResult, string) {
	m, c := k.m, k.c
	switch c.when {
	case "before":
		if err := m.inject(c.fault); err != nil {
			return mxResult{}, "fault: " + err.Error()
		}
		return k.await(k.start())
	case "wait":
		res := k.start()
		wname := k.heldNames()[0]
		var early mxResult
		returned := false
		if !testenv.Poll(c.bound()+10*time.Second, func() bool {
			select {
			case early = <-res:
				returned = true
				return true
			default:
			}
			return m.waiting(c.kind, wname, k.app)
		}) {
			r, _ := k.await(res)
			return r, "B was never seen waiting"
		}
		if returned {
			return early, "B returned before it was seen waiting"
		}
		select {
		case r := <-res:
			return r, "B returned before the fault"
		case <-time.After(mxFaultAt):
		}
		if err := m.inject(c.fault); err != nil {
			r, _ := k.await(res)
			return r, "fault: " + err.Error()
		}
		return k.await(res)
	}
	struck, done := m.armTrip(c.fault, k.name, k.names()[0], k.quit)
	k.struck = done
	res := k.start()
	select {
	case <-struck:
	case r := <-res:
		select {
		case <-struck: // the fault made it return
			return r, ""
		case <-time.After(100 * time.Millisecond):
			return r, "B returned before the fault struck its acquiring request"
		}
	}
	return k.await(res)
}

// start runs B's call.
func (k *mxCall) start() <-chan mxResult {
	res := make(chan mxResult, 1)
	k.t0 = time.Now()
	go func() {
		err := k.invoke()
		res <- mxResult{err, time.Since(k.t0)}
	}()
	return res
}

// await returns B's result; a call still running 10s past its bound is
// helped by ending the fault, and noted.
func (k *mxCall) await(res <-chan mxResult) (mxResult, string) {
	select {
	case r := <-res:
		return r, ""
	case <-time.After(time.Until(k.t0.Add(k.c.bound() + 10*time.Second))):
	}
	k.heal()
	select {
	case r := <-res:
		return r, "returned only once the store was back"
	case <-time.After(time.Minute):
		return mxResult{errors.New("still running a minute after the store came back"), time.Since(k.t0)}, "hung"
	}
}

func (k *mxCall) heal() error {
	if k.healed {
		return nil
	}
	k.healed = true
	if k.struck != nil {
		close(k.quit) // an armed fault that has not struck never will
		<-k.struck
	}
	return k.m.heal(k.c.fault)
}

// invoke is B's call.
func (k *mxCall) invoke() error {
	c, opts := k.c, k.opts()
	ctx, cancel := context.Background(), context.CancelFunc(func() {}) // WithWaitTimeout: no deadline
	if c.mode != "waittimeout" {
		ctx, cancel = context.WithTimeout(ctx, c.deadline())
	}
	defer cancel()
	switch c.kind {
	case "run":
		return k.lockRun(c.deadline())
	case "gocron":
		g := gocronlock.New(k.b.as(opts...), gocronlock.WithLockTimeout(c.deadline()), gocronlock.WithKeyPrefix(""), gocronlock.WithLogger(nil))
		defer func() { go g.Close() }()
		l, err := g.Lock(context.Background(), k.name)
		if err == nil {
			go l.Unlock(context.Background())
		}
		return err
	case "all":
		h, err := lock.AcquireAll(ctx, k.b.as(opts...), k.names()...)
		if err == nil {
			go h.Release()
		}
		return err
	}
	h, err := k.b.as(opts...).Acquire(ctx, k.name)
	if err == nil {
		go h.Release()
	}
	return err
}

// lockRun runs `lock run -w wait` on the name through the proxy.
func (k *mxCall) lockRun(wait time.Duration) error {
	bin, err := k.m.bin.get()
	if err != nil {
		return err
	}
	args := []string{"run", "--backend", k.m.url(k.m.p.addr(), k.app), "-w", wait.String()}
	if k.m.ttl != "" {
		args = append(args, "--ttl", k.m.ttl)
	}
	cmd := exec.Command(bin, append(args, k.name, "--", "true")...)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return &mxExit{code: ee.ExitCode(), stderr: strings.TrimSpace(string(out))}
	}
	return err
}

// take has f take names with opts (and both permits of a semaphore),
// each waiting if wait, all within d.
func (k *mxCall) take(f *mxFactory, d time.Duration, wait bool, opts []lock.Option, names ...string) ([]lock.Holder, error) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	if wait {
		opts = append(opts, lock.WithWait())
	}
	n := 1
	if k.c.kind == "semaphore" {
		n = 2
		opts = append(opts, lock.WithMaxConcurrent(2))
	}
	var hs []lock.Holder
	for _, name := range names {
		for range n {
			h, err := f.as(opts...).Acquire(ctx, name)
			if err != nil {
				release(hs)
				return nil, fmt.Errorf("%s: %w", name, err)
			}
			hs = append(hs, h)
		}
	}
	return hs, nil
}

func release(hs []lock.Holder) {
	for _, h := range hs {
		h.Release()
	}
}

// after checks, once the store is back, that A's release leaves the name
// to a fresh client C within the clean-up bound, that nothing is left
// held or queued, and that B's side is served again.
func (k *mxCall) after(o *mxOutcome) {
	m := k.m
	release(k.held)
	k.held = nil
	c, err := k.factory(m.addr, "chaos-c", false)
	if err != nil {
		o.fail("C: %v", err)
		return
	}
	limit := m.cleanup + mxSlack
	t0 := time.Now()
	hs, err := k.take(c, limit+5*time.Second, true, nil, k.names()...)
	o.clean = time.Since(t0)
	release(hs)
	switch {
	case err != nil:
		o.fail("C did not get the name: %v", err)
	case o.clean > limit:
		o.fail("C waited %v, past the clean-up bound %v", o.clean.Round(time.Millisecond), limit)
	}
	var left string
	testenv.Poll(limit, func() bool { left = m.left(k.names()); return left == "" })
	if left != "" {
		o.fail("left in the store %v after C released: %s", limit, left)
	}
	t0 = time.Now()
	if k.c.kind == "run" {
		err = k.lockRun(10 * time.Second)
	} else {
		hs, err = k.take(k.b, 10*time.Second, true, nil, k.names()...)
		release(hs)
	}
	if o.next = time.Since(t0); err != nil {
		o.fail("B's next call failed: %v", err)
	}
}

// close closes the run's factories in the background: a factory that
// hangs on Close is noted in the log, not waited for.
func (k *mxCall) close() {
	k.heal()
	release(k.held)
	done := make(chan struct{})
	go func() {
		for _, f := range k.closers {
			f()
		}
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		k.m.t.Logf("%v: closing its factories took more than 10s", k.c)
	}
}
