package backend_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/backend"
)

func TestEscape(t *testing.T) {
	for in, want := range map[string]string{
		"nightly-import":    "nightly-import",
		"a/b":               "a%2Fb",
		"x.0":               "x%2E0",
		"../../etc/passwd":  "%2E%2E%2F%2E%2E%2Fetc%2Fpasswd",
		"stripe-event:ev_1": "stripe-event%3Aev_1",
	} {
		if got := backend.Escape(in); got != want {
			t.Errorf("Escape(%q) = %q, want %q", in, got, want)
		}
	}
	if e := backend.Escape(strings.Repeat("a", 160)); e != strings.Repeat("a", 160) {
		t.Errorf("a plain name of 160 bytes escaped to %q", e)
	}
	if e := backend.Escape(strings.Repeat("a", 161)); !strings.HasPrefix(e, strings.Repeat("a", 96)+"~") {
		t.Errorf("a plain name of 161 bytes escaped to %q, want it cut and hashed", e)
	}
	if n := testing.AllocsPerRun(100, func() { backend.Escape("nightly-import") }); n != 0 {
		t.Errorf("Escape of a plain name allocates %v times", n)
	}
	long := strings.Repeat("é", lock.MaxNameLen/2)
	if e := backend.Escape(long); len(e) > 200 || !strings.Contains(e, "~") {
		t.Errorf("long name escaped to %d bytes: %q", len(e), e)
	}
}

func FuzzEscape(f *testing.F) {
	for _, s := range []string{"a", "a/b", "a%2Fb", "x.0", "x:fence", "../../x", "~", strings.Repeat("%", 100), strings.Repeat("ab", 200)} {
		f.Add(s, s+"/")
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		if lock.ValidateName(a) != nil || lock.ValidateName(b) != nil {
			return
		}
		ea, eb := backend.Escape(a), backend.Escape(b)
		if (a == b) != (ea == eb) {
			t.Fatalf("Escape(%q) = %q, Escape(%q) = %q", a, ea, b, eb)
		}
		if strings.ContainsAny(ea, "/.\x00") || len(ea) > 200 {
			t.Fatalf("Escape(%q) = %q: unsafe as a file name or key segment", a, ea)
		}
	})
}

func TestState(t *testing.T) {
	s := backend.NewState()
	if s.Ended() || s.Err() != nil {
		t.Fatal("new state ended")
	}
	if !s.Lose(lock.ErrLockLost) || s.End() || s.Lose(lock.ErrLockLost) {
		t.Fatal("a state ends once")
	}
	<-s.Done()
	if s.Err() != lock.ErrLockLost {
		t.Fatal(s.Err())
	}
}

type tokenHolder struct{ lock.Holder }

func (tokenHolder) Token() uint64 { return 7 }

// Take reports one event per call: the outcome, the token of a holder,
// the wait, and an error.
func TestTakeReports(t *testing.T) {
	var events []lock.Event
	o := &lock.Options{Observer: lock.ObserverFunc(func(_ context.Context, e lock.Event) { events = append(events, e) })}
	ctx := context.Background()
	h, err := backend.Take(ctx, backend.Call{Backend: "toy", Name: "a", Locked: lock.ErrLocked, Start: time.Now()}, o, nil, func(context.Context) (tokenHolder, time.Duration, error) {
		return tokenHolder{}, time.Millisecond, nil
	})
	if err != nil || h.Token() != 7 {
		t.Fatalf("Take = %v, %v", h, err)
	}
	bad := errors.New("bad option")
	if _, err = backend.Take[tokenHolder](ctx, backend.Call{Backend: "toy", Name: "b", Locked: lock.ErrLocked, Start: time.Now()}, o, bad, nil); err != bad {
		t.Fatalf("Take after a resolve error = %v", err)
	}
	if len(events) != 2 {
		t.Fatalf("%d events, want 2: %+v", len(events), events)
	}
	if e := events[0]; e.Backend != "toy" || e.Op != lock.OpAcquire || e.Name != "a" || e.Token != 7 || e.Wait != time.Millisecond || e.Outcome != lock.OutcomeOK {
		t.Errorf("success event = %+v", e)
	}
	if e := events[1]; e.Name != "b" || e.Err != bad || e.Outcome != lock.OutcomeError || e.Token != 0 {
		t.Errorf("error event = %+v", e)
	}
}

// With WithWait, an error that is ctx's ending is a WaitError on the
// backend's ErrLocked, whether the wait began or not, when the probe
// succeeds or there is none; when the probe fails it is that failure,
// not ErrLocked. Without WithWait, or for another error, the error is
// left as it is.
func TestTakeWaitEndedByContext(t *testing.T) {
	locked := fmt.Errorf("toy: %w", lock.ErrLocked)
	down := errors.New("toy: connection refused")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	probed := 0
	finish := func(wait bool, takeErr, probeErr error) error {
		c := backend.Call{Backend: "toy", Name: "a", Locked: locked, Start: time.Now(), Probe: func(pctx context.Context) error {
			if pctx.Err() != nil {
				t.Error("probe ran on a context already done")
			}
			probed++
			return probeErr
		}}
		_, err := backend.Take(ctx, c, &lock.Options{Wait: wait}, nil, func(context.Context) (tokenHolder, time.Duration, error) {
			return tokenHolder{}, 0, takeErr
		})
		return err
	}
	mid := fmt.Errorf("toy: acquire: %w", context.Canceled)
	if err := finish(true, mid, nil); !errors.Is(err, locked) || !errors.Is(err, context.Canceled) {
		t.Errorf("wait cancelled mid-request, backend up: %v, want a WaitError", err)
	}
	if err := finish(true, mid, down); errors.Is(err, lock.ErrLocked) || !errors.Is(err, down) || !errors.Is(err, context.Canceled) {
		t.Errorf("wait cancelled mid-request, backend down: %v, want the probe's failure and ctx's error, not ErrLocked", err)
	}
	if probed != 2 {
		t.Errorf("probed %d times, want 2", probed)
	}
	if err := finish(false, mid, down); err != mid {
		t.Errorf("no wait: %v, want the error as it is", err)
	}
	if err := finish(true, lock.ErrClosed, down); err != lock.ErrClosed {
		t.Errorf("closed: %v, want the error as it is", err)
	}
	said := lock.NewWaitError(locked, ctx)
	if err := finish(true, said, down); err != said {
		t.Errorf("a WaitError already: %v, want it as it is", err)
	}
	if probed != 2 {
		t.Errorf("probed %d times, want 2: only for a wait that ended with ctx", probed)
	}
}

// levels is a slog handler that records the level of every record.
type levels struct {
	mu  sync.Mutex
	got []slog.Level
}

func (l *levels) Enabled(context.Context, slog.Level) bool { return true }
func (l *levels) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.got = append(l.got, r.Level)
	return nil
}
func (l *levels) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *levels) WithGroup(string) slog.Handler      { return l }

// A loss is logged at Warn, unless Close caused it: the caller asked for
// that, so it is logged at Debug. The observer sees both.
func TestReportLevels(t *testing.T) {
	for _, tc := range []struct {
		what string
		e    lock.Event
		want slog.Level
	}{
		{"acquired", lock.Event{Op: lock.OpAcquire}, slog.LevelDebug},
		{"failed", lock.Event{Op: lock.OpAcquire, Err: errors.New("down")}, slog.LevelWarn},
		{"lost", lock.Event{Op: lock.OpLost, Err: lock.ErrLockLost}, slog.LevelWarn},
		{"lost to Close", lock.Event{Op: lock.OpLost, Err: fmt.Errorf("%w: %w", lock.ErrLockLost, lock.ErrClosed)}, slog.LevelDebug},
	} {
		h := &levels{}
		var seen int
		o := &lock.Options{Logger: slog.New(h), Observer: lock.ObserverFunc(func(context.Context, lock.Event) { seen++ })}
		backend.Report(context.Background(), o, tc.e)
		if len(h.got) != 1 || h.got[0] != tc.want || seen != 1 {
			t.Errorf("%s: logged at %v, observed %d times; want one line at %v, observed once", tc.what, h.got, seen, tc.want)
		}
	}
}

// A failure the backend retries by itself is observed as an error and
// logged at Debug: the loss it may lead to has its own Warn line.
func TestReportRetried(t *testing.T) {
	h := &levels{}
	var got []lock.Event
	o := &lock.Options{Logger: slog.New(h), Observer: lock.ObserverFunc(func(_ context.Context, e lock.Event) { got = append(got, e) })}
	backend.ReportRetried(context.Background(), o, lock.Event{Op: lock.OpExtend, Err: errors.New("down")})
	if len(h.got) != 1 || h.got[0] != slog.LevelDebug || len(got) != 1 || got[0].Outcome != lock.OutcomeError {
		t.Errorf("logged at %v, observed %+v; want one Debug line and one error event", h.got, got)
	}
}

// Take runs take on a context bounded by WithWaitTimeout, not at all after
// a resolve error, and finishes either way.
func TestTake(t *testing.T) {
	var events int
	o := &lock.Options{WaitTimeout: time.Hour, Observer: lock.ObserverFunc(func(context.Context, lock.Event) { events++ })}
	c := backend.Call{Backend: "toy", Name: "a", Locked: lock.ErrLocked, Start: time.Now()}
	_, err := backend.Take(context.Background(), c, o, nil, func(ctx context.Context) (tokenHolder, time.Duration, error) {
		if _, ok := ctx.Deadline(); !ok {
			t.Error("take's context has no deadline with WaitTimeout set")
		}
		return tokenHolder{}, 0, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	bad := errors.New("bad option")
	_, err = backend.Take(context.Background(), c, &lock.Options{}, bad, func(ctx context.Context) (tokenHolder, time.Duration, error) {
		t.Error("take ran after a resolve error")
		return tokenHolder{}, 0, nil
	})
	if err != bad || events != 1 {
		t.Fatalf("Take after a resolve error = %v (%d events from the first call, want 1)", err, events)
	}
}

// releasedHolder records its Release.
type releasedHolder struct {
	tokenHolder
	released chan struct{}
}

func (h releasedHolder) Release() error { close(h.released); return nil }

// A store that does not answer: Take returns within Grace of ctx's end
// whatever take does, with an error decided by what the attempts learnt,
// and a lock take gets afterwards is released.
func TestTakeBounded(t *testing.T) {
	locked := fmt.Errorf("toy: %w", lock.ErrLocked)
	for _, tc := range []struct {
		what   string
		wait   bool
		held   bool // an attempt found the name held just before the deadline
		locked bool // want ErrLocked
	}{
		{"no wait", false, false, false},
		{"wait, never answered", true, false, false},
		{"wait, held lately", true, true, true},
	} {
		t.Run(tc.what, func(t *testing.T) {
			stuck := make(chan struct{})
			h := releasedHolder{released: make(chan struct{})}
			c := backend.Call{Backend: "toy", Name: "a", Locked: locked, Start: time.Now(), Probe: func(ctx context.Context) error {
				<-stuck // the ping gets no answer either, and ignores ctx
				return nil
			}}
			ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
			defer cancel()
			start := time.Now()
			_, err := backend.Take(ctx, c, &lock.Options{Wait: tc.wait}, nil, func(ctx context.Context) (releasedHolder, time.Duration, error) {
				sub := &toySub{wake: make(chan struct{}, 1)}
				w := backend.Waiting{Wait: tc.wait, Locked: locked, MinPoll: time.Hour, MaxPoll: time.Hour,
					Subscribe: func() (backend.Subscription, error) { return sub, nil }}
				n := 0
				return backend.Wait(ctx, w, func() (releasedHolder, time.Duration, error) {
					if n++; tc.held && n <= 2 {
						if n == 2 {
							sub.wake <- struct{}{} // the third attempt gets no answer
						}
						return releasedHolder{}, 0, locked
					}
					<-stuck // sent, never answered, whatever ctx says
					return h, 0, nil
				})
			})
			took := time.Since(start)
			if err == nil || errors.Is(err, lock.ErrLocked) != tc.locked || !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("err = %v; want ErrLocked %v, and the deadline", err, tc.locked)
			}
			if !tc.locked && !strings.HasPrefix(err.Error(), "toy: acquire: no answer from the store") {
				t.Errorf("err = %q; want it to say the store did not answer", err)
			}
			t.Logf("%v after %v", err, took)
			close(stuck)
			if tc.held {
				return
			}
			select {
			case <-h.released:
			case <-time.After(10 * time.Second):
				t.Fatal("the lock taken after the call returned was not released")
			}
		})
	}
}

func TestUnescape(t *testing.T) {
	long := strings.Repeat("é", 100)
	for _, name := range []string{"a", "x/y z", "é/ü", "a%2Fb", "~tilde", strings.Repeat("n", 150)} {
		esc := backend.Escape(name)
		if got, ok := backend.UnescapeForTest(esc); !ok || got != name {
			t.Errorf("Unescape(Escape(%q)) = %q, %v", name, got, ok)
		}
		if !strings.HasPrefix(esc, backend.EscapePrefix(name[:len(name)/2])) {
			t.Errorf("EscapePrefix of half of %q does not begin %q", name, esc)
		}
	}
	if _, ok := backend.UnescapeForTest(backend.Escape(long)); ok {
		t.Error("Unescape of a hashed name succeeded")
	}
	if !strings.HasPrefix(backend.Escape(long), backend.EscapePrefix(long)) {
		t.Error("EscapePrefix of a long name does not begin its hashed form")
	}
	for _, bad := range []string{"a%2", "a%zz", "a%41", "a.b", "a%2f"} {
		if got, ok := backend.UnescapeForTest(bad); ok {
			t.Errorf("Unescape(%q) = %q; want failure", bad, got)
		}
	}
}

// fakeClock is an AfterFunc whose timers fire when the test says.
type fakeClock struct {
	mu      sync.Mutex
	d       time.Duration
	f       func()
	stopped bool
}

func (c *fakeClock) after(d time.Duration, f func()) func() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.d, c.f = d, f
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.stopped = true
		return true
	}
}

func TestStateBound(t *testing.T) {
	lost := fmt.Errorf("toy: %w", lock.ErrLockLost)
	o, _ := lock.Apply(lock.Options{}, lock.WithMaxHold(time.Minute))
	var c fakeClock
	s := backend.NewState()
	var got error
	s.Bound(&o, lost, c.after, func(err error) { got = err; s.Lose(err) })
	if c.d != time.Minute || c.f == nil {
		t.Fatalf("timer armed for %v", c.d)
	}
	c.f()
	<-s.Done()
	for _, want := range []error{lost, lock.ErrLockLost, lock.ErrMaxHold} {
		if !errors.Is(s.Err(), want) || !errors.Is(got, want) {
			t.Errorf("Err = %v; want it to match %v", s.Err(), want)
		}
	}
	if !strings.HasPrefix(s.Err().Error(), "toy: lock: lock lost: held for 1m0s") {
		t.Errorf("Err says %q", s.Err())
	}

	// A release first stops the timer; no bound arms nothing.
	c = fakeClock{}
	s = backend.NewState()
	s.Bound(&o, lost, c.after, func(error) { t.Error("end ran") })
	s.End()
	if !c.stopped {
		t.Error("End did not stop the timer")
	}
	c = fakeClock{}
	backend.NewState().Bound(&lock.Options{}, lost, c.after, func(error) {})
	if c.f != nil {
		t.Error("a timer armed without WithMaxHold")
	}
	// Real time by default.
	o, _ = lock.Apply(lock.Options{}, lock.WithMaxHold(time.Millisecond))
	s = backend.NewState()
	s.Bound(&o, lost, nil, func(err error) { s.Lose(err) })
	<-s.Done()
}

// A store's other records under its prefix are no names; a hashed long
// name is listed as its escaped form.
func TestListedName(t *testing.T) {
	long := strings.Repeat("n", 200)
	for _, c := range []struct {
		esc, prefix, name string
		match             bool
	}{
		{"jobs%2Fa", "jobs/", "jobs/a", true},
		{"jobs%2Fa", "other", "jobs/a", false},
		{backend.Escape(long), "nnn", backend.Escape(long), true},
		{".fence", "", "", false},
		{".done", "", "", false},
		{"x~notahash", "", "", false},
	} {
		name, match := backend.ListedName(c.esc, c.prefix)
		if name != c.name || match != c.match {
			t.Errorf("ListedName(%q, %q) = %q, %v; want %q, %v", c.esc, c.prefix, name, match, c.name, c.match)
		}
	}
}
