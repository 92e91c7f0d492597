package gocronlock_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/google/uuid"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/contrib/gocronlock"
	"github.com/ubgo/lock/memlock"
)

func held(t *testing.T, f *memlock.Factory, name string) bool {
	t.Helper()
	info, err := f.Inspect(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	return len(info.Holders) > 0
}

// A job without gocron.WithName gets its function's name from gocron; the
// Locker must refuse it, and the job must not run.
func TestUnnamedJobIsRejected(t *testing.T) {
	f := memlock.NewFactory()
	defer f.Close()
	l := gocronlock.New(f.AsLocker(), gocronlock.WithLogger(nil))
	defer l.Close()
	s, err := gocron.NewScheduler(gocron.WithDistributedLocker(l))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown()
	var ran atomic.Bool
	got := make(chan error, 1)
	job, err := s.NewJob(gocron.OneTimeJob(gocron.OneTimeJobStartImmediately()),
		gocron.NewTask(func() { ran.Store(true) }),
		gocron.WithEventListeners(gocron.AfterLockError(func(_ uuid.UUID, _ string, err error) { got <- err })))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("gocron's default job name: %q", job.Name())
	s.Start()
	select {
	case err := <-got:
		if !errors.Is(err, gocronlock.ErrUnnamedJob) || !errors.Is(err, lock.ErrInvalidName) {
			t.Fatalf("lock error = %v, want ErrUnnamedJob", err)
		}
		if errors.Is(err, lock.ErrLocked) {
			t.Fatalf("a naming error must not look like contention: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no lock error for an unnamed job")
	}
	if ran.Load() {
		t.Fatal("unnamed job ran")
	}
}

func TestJobNames(t *testing.T) {
	funcNames := []string{
		"main.syncJob",
		"main.main.func1",
		"github.com/acme/app/jobs.Sync",
		"github.com/acme/app/jobs.(*Service).Run-fm",
		"github.com/acme/app/jobs.Service.Run-fm",
		"github.com/ubgo/lock/contrib/gocronlock_test.TestJobNames.func1.2",
		"gopkg.in/yaml%2ev3.Unmarshal",
		"example.com/m.Map[...]",
		"billing.daily", // shaped like one; WithAllowFuncNames accepts it
	}
	// The real default names of a closure, a function and a method value.
	s, err := gocron.NewScheduler()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown()
	var svc service
	for _, task := range []any{func() {}, t.Name, svc.run} {
		j, err := s.NewJob(gocron.DurationJob(time.Hour), gocron.NewTask(task))
		if err != nil {
			t.Fatal(err)
		}
		funcNames = append(funcNames, j.Name())
	}
	names := []string{
		"sync-data", "midnight-billing", "reports/daily", "v1.2", "backup 2024.05",
		"billing:daily", "job.", ".job", "a.b c", "über-job", "tenant@eu",
	}

	f := memlock.NewFactory()
	defer f.Close()
	ctx := context.Background()
	strict := gocronlock.New(f.AsLocker(), gocronlock.WithLogger(nil), gocronlock.WithMinHold(0))
	lax := gocronlock.New(f.AsLocker(), gocronlock.WithLogger(nil), gocronlock.WithMinHold(0), gocronlock.WithAllowFuncNames())
	for _, n := range funcNames {
		if _, err := strict.Lock(ctx, n); !errors.Is(err, gocronlock.ErrUnnamedJob) {
			t.Errorf("Lock(%q) = %v, want ErrUnnamedJob", n, err)
		}
		lk, err := lax.Lock(ctx, n)
		if err != nil {
			t.Errorf("WithAllowFuncNames: Lock(%q) = %v", n, err)
			continue
		}
		lk.Unlock(ctx)
	}
	for _, n := range names {
		lk, err := strict.Lock(ctx, n)
		if err != nil {
			t.Errorf("Lock(%q) = %v", n, err)
			continue
		}
		if !held(t, f, gocronlock.DefaultKeyPrefix+n) {
			t.Errorf("Lock(%q) did not take %q", n, gocronlock.DefaultKeyPrefix+n)
		}
		if err := lk.Unlock(ctx); err != nil {
			t.Errorf("Unlock(%q) = %v", n, err)
		}
	}
	// A name that ends like a tick suffix could meet another job's tick
	// lock; it is refused, with or without tick locks.
	for _, l := range []*gocronlock.Locker{strict, lax} {
		if _, err := l.Lock(ctx, "sync@2026-05-04T00:00:00Z"); !errors.Is(err, lock.ErrInvalidName) {
			t.Errorf("tick-like name: Lock = %v, want ErrInvalidName", err)
		}
	}
}

type service struct{}

func (service) run() {}

func TestKeyPrefixAndTickKeys(t *testing.T) {
	f := memlock.NewFactory()
	defer f.Close()
	ctx := context.Background()
	l := gocronlock.New(f.AsLocker(), gocronlock.WithKeyPrefix("app1/"), gocronlock.WithMinHold(0),
		gocronlock.WithTickResolution(time.Minute))
	defer l.Close()
	before := time.Now()
	lk, err := l.Lock(ctx, "sync")
	if err != nil {
		t.Fatal(err)
	}
	after := time.Now()
	if !held(t, f, "app1/sync") {
		t.Fatal("job lock not under the prefix")
	}
	tickName := func(at time.Time) string {
		return "app1/sync@" + at.Round(time.Minute).UTC().Format(time.RFC3339Nano)
	}
	if !held(t, f, tickName(before)) && !held(t, f, tickName(after)) {
		t.Fatalf("tick lock %q not held", tickName(before))
	}
	// The same tick cannot be taken again, even after the job lock is gone.
	if err := lk.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if held(t, f, "app1/sync") {
		t.Fatal("job lock kept with WithMinHold(0)")
	}
	if tickName(before) == tickName(after) {
		_, err := l.Lock(ctx, "sync")
		if !errors.Is(err, gocronlock.ErrLocked) || !errors.Is(err, memlock.ErrLocked) {
			t.Fatalf("second Lock of the same tick = %v, want ErrLocked", err)
		}
	}
}

func TestErrorsTellContentionFromFailure(t *testing.T) {
	f := memlock.NewFactory()
	ctx := context.Background()
	a := gocronlock.New(f.AsLocker(), gocronlock.WithMinHold(0))
	b := gocronlock.New(f.AsLocker(), gocronlock.WithMinHold(0))
	lk, err := a.Lock(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	_, err = b.Lock(ctx, "job")
	for _, target := range []error{lock.ErrLocked, gocronlock.ErrLocked, memlock.ErrLocked} {
		if !errors.Is(err, target) {
			t.Errorf("contention error %v does not match %v", err, target)
		}
	}
	lk.Unlock(ctx)
	f.Close() // the backend is gone
	_, err = b.Lock(ctx, "job")
	if err == nil || errors.Is(err, lock.ErrLocked) || !errors.Is(err, lock.ErrClosed) {
		t.Fatalf("Lock on a closed backend = %v, want a non-contention error", err)
	}
}

func TestBadConfiguration(t *testing.T) {
	f := memlock.NewFactory()
	defer f.Close()
	ctx := context.Background()
	for name, l := range map[string]*gocronlock.Locker{
		"nil locker":        gocronlock.New(nil),
		"negative hold":     gocronlock.New(f.AsLocker(), gocronlock.WithMinHold(-time.Second)),
		"negative tick":     gocronlock.New(f.AsLocker(), gocronlock.WithTickResolution(-time.Second)),
		"negative extend":   gocronlock.New(f.AsLocker(), gocronlock.WithExtendEvery(-time.Second)),
		"zero retry (elec)": gocronlock.New(f.AsLocker(), gocronlock.WithRetryInterval(0)),
		"zero lock timeout": gocronlock.New(f.AsLocker(), gocronlock.WithLockTimeout(0)),
	} {
		if _, err := l.Lock(ctx, "job"); !errors.Is(err, lock.ErrInvalidOption) {
			t.Errorf("%s: Lock = %v, want ErrInvalidOption", name, err)
		}
	}
	for name, e := range map[string]*gocronlock.Elector{
		"nil locker":     gocronlock.NewElector(nil, "leader"),
		"empty name":     gocronlock.NewElector(f.AsLocker(), ""),
		"bad name":       gocronlock.NewElector(f.AsLocker(), "a\x00b"),
		"negative delay": gocronlock.NewElector(f.AsLocker(), "leader", gocronlock.WithTakeoverDelay(-1)),
	} {
		if err := e.IsLeader(ctx); err == nil || !errors.Is(err, gocronlock.ErrNotLeader) {
			t.Errorf("%s: IsLeader = %v", name, err)
		}
		if err := e.Close(); err == nil {
			t.Errorf("%s: Close reported no error", name)
		}
	}
}

// gocron unlocks with the job's context, which is cancelled when the job is
// removed or the scheduler stops. The release must not depend on it, and a
// minimum hold must not block Unlock.
func TestUnlockWithCancelledContext(t *testing.T) {
	f := memlock.NewFactory()
	defer f.Close()
	l := gocronlock.New(f.AsLocker(), gocronlock.WithMinHold(200*time.Millisecond))
	defer l.Close()
	ctx, cancel := context.WithCancel(context.Background())
	lk, err := l.Lock(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := lk.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if !held(t, f, "gocron:job") {
		t.Fatal("released before the minimum hold")
	}
	if !waitFor(10*time.Second, func() bool { return !held(t, f, "gocron:job") }) {
		t.Fatal("lock not released after the minimum hold")
	}

	// Past the hold, Unlock releases at once, with the cancelled context.
	l0 := gocronlock.New(f.AsLocker(), gocronlock.WithMinHold(0))
	lk, err = l0.Lock(context.Background(), "job")
	if err != nil {
		t.Fatal(err)
	}
	if err := lk.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if held(t, f, "gocron:job") {
		t.Fatal("Unlock with a cancelled context did not release")
	}
}

func TestCloseReleasesHeldLocks(t *testing.T) {
	base := runtime.NumGoroutine()
	f := memlock.NewFactory()
	defer f.Close()
	l := gocronlock.New(f.AsLocker(), gocronlock.WithMinHold(time.Hour), gocronlock.WithTickResolution(time.Hour))
	ctx := context.Background()
	for _, job := range []string{"a", "b", "c"} {
		lk, err := l.Lock(ctx, job)
		if err != nil {
			t.Fatal(err)
		}
		lk.Unlock(ctx)
	}
	if !held(t, f, "gocron:a") {
		t.Fatal("hold not kept")
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	for _, job := range []string{"a", "b", "c"} {
		if held(t, f, "gocron:"+job) {
			t.Fatalf("Close left %s held", job)
		}
	}
	if _, err := l.Lock(ctx, "a"); !errors.Is(err, lock.ErrClosed) {
		t.Fatalf("Lock after Close = %v", err)
	}
	if !waitFor(5*time.Second, func() bool { return runtime.NumGoroutine() <= base }) {
		t.Fatalf("goroutines: %d before, %d after Close", base, runtime.NumGoroutine())
	}
}

// A job learns through JobContext that its lock was lost, whether the
// backend takes it away (ForceLoss stands for a dead session) or its lease
// runs out because nobody renewed it.
func TestLostLockCancelsJob(t *testing.T) {
	cases := map[string]struct {
		opts []lock.Option
		lose func(f *memlock.Factory)
	}{
		"forced": {nil, func(f *memlock.Factory) { f.ForceLoss("gocron:job") }},
		"lease":  {[]lock.Option{lock.WithTTL(100 * time.Millisecond), lock.WithAutoRenew(false)}, func(*memlock.Factory) {}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			f := memlock.NewFactory()
			defer f.Close()
			l := gocronlock.New(f.AsLocker(tc.opts...), gocronlock.WithMinHold(0))
			defer l.Close()
			s, err := gocron.NewScheduler(gocron.WithDistributedLocker(l))
			if err != nil {
				t.Fatal(err)
			}
			defer s.Shutdown()
			running := make(chan lock.Holder, 1)
			cause := make(chan error, 1)
			jobOK(t)(s.NewJob(gocron.OneTimeJob(gocron.OneTimeJobStartImmediately()),
				gocron.NewTask(func(ctx context.Context) {
					jctx, cancel := gocronlock.JobContext(ctx)
					defer cancel()
					running <- gocronlock.JobHolder(ctx)
					select {
					case <-jctx.Done():
						cause <- context.Cause(jctx)
					case <-time.After(10 * time.Second):
						cause <- nil
					}
				}),
				gocron.WithName("job")))
			s.Start()
			h := <-running
			if h == nil || h.Token() == 0 {
				t.Fatalf("JobHolder = %v", h)
			}
			tc.lose(f)
			if err := <-cause; !errors.Is(err, lock.ErrLockLost) {
				t.Fatalf("job context cause = %v, want ErrLockLost", err)
			}
			if !errors.Is(h.Err(), lock.ErrLockLost) {
				t.Fatalf("holder Err = %v", h.Err())
			}
		})
	}
}

// JobContext outside a locked run is just a cancellable child.
func TestJobContextWithoutLock(t *testing.T) {
	ctx, cancel := gocronlock.JobContext(context.Background())
	if gocronlock.JobHolder(ctx) != nil {
		t.Fatal("holder for a context no Locker saw")
	}
	select {
	case <-ctx.Done():
		t.Fatal("cancelled early")
	default:
	}
	cancel()
	<-ctx.Done()
}

// waitFor polls cond until it holds or d has passed.
func waitFor(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if cond() {
			return true
		}
		time.Sleep(5 * time.Millisecond)
	}
	return cond()
}

// jobOK returns a function that fails t if NewJob failed.
func jobOK(t *testing.T) func(gocron.Job, error) {
	return func(_ gocron.Job, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(fmt.Errorf("NewJob: %w", err))
		}
	}
}

// A Locker whose lock.Locker is misconfigured, or waits, is unusable from
// New: Err says why, New logs it once at Error level, and every Lock
// returns it instead of a WARN line per skipped tick.
func TestUnusableLockerIsReportedAtStartup(t *testing.T) {
	bad := memlock.NewFactory(memlock.WithMaxConcurrent(-1))
	defer bad.Close()
	good := memlock.NewFactory()
	defer good.Close()
	for name, l := range map[string]lock.Locker{
		"factory with an invalid option":  bad.AsLocker(),
		"AsLocker with an invalid option": good.AsLocker(memlock.WithTTL(-time.Second)),
		"Locker with WithWait":            good.AsLocker(memlock.WithWait()),
	} {
		t.Run(name, func(t *testing.T) {
			var logged bytes.Buffer
			a := gocronlock.New(l, gocronlock.WithLogger(slog.New(slog.NewTextHandler(&logged, nil))))
			defer a.Close()
			if err := a.Err(); !errors.Is(err, lock.ErrInvalidOption) {
				t.Fatalf("Err = %v, want ErrInvalidOption", err)
			}
			if got := strings.Count(logged.String(), "level=ERROR"); got != 1 {
				t.Fatalf("New logged %d errors, want 1:\n%s", got, logged.String())
			}
			for range 2 {
				_, err := a.Lock(context.Background(), "job")
				if !errors.Is(err, lock.ErrInvalidOption) || errors.Is(err, lock.ErrLocked) {
					t.Fatalf("Lock = %v, want the configuration error", err)
				}
			}
			if n := strings.Count(logged.String(), "\n"); n != 1 {
				t.Fatalf("Lock logged more:\n%s", logged.String())
			}
			if held(t, good, "gocron:job") {
				t.Fatal("Lock took the lock")
			}
		})
	}
	a := gocronlock.New(good.AsLocker(), gocronlock.WithLogger(nil))
	defer a.Close()
	if err := a.Err(); err != nil {
		t.Fatalf("Err of a usable Locker = %v", err)
	}
}

// A run's job lock is kept until the job's next tick in this process: a
// replica whose timer fires anywhere in between finds it taken, however
// far apart the replicas' timers are. The job's own next tick runs on it
// (TestOwnerKeepsJobLock). When the job ends (its context is cancelled),
// the lock is kept until the tick that will not come: the latest Lock plus
// the gap between the two latest.
func TestRunLockKeptUntilNextTick(t *testing.T) {
	f := memlock.NewFactory()
	defer f.Close()
	here := gocronlock.New(f.AsLocker(), gocronlock.WithMinHold(0))
	defer here.Close()
	there := gocronlock.New(f.AsLocker(), gocronlock.WithMinHold(0))
	defer there.Close()
	jobCtx, endJob := context.WithCancel(context.Background()) // gocron's job context
	defer endJob()
	otherCtx, endOther := context.WithCancel(context.Background())
	defer endOther()
	const gap = 500 * time.Millisecond // the job's interval
	var last time.Time
	for tick := range 2 {
		if tick > 0 {
			time.Sleep(gap) // the scheduler's interval, not a synchronisation
		}
		last = time.Now()
		lk, err := here.Lock(jobCtx, "job")
		if err != nil {
			t.Fatalf("tick %d: Lock = %v", tick, err)
		}
		if err := lk.Unlock(jobCtx); err != nil {
			t.Fatal(err)
		}
		if !held(t, f, "gocron:job") {
			t.Fatalf("tick %d: job lock released after the run", tick)
		}
		if _, err := there.Lock(otherCtx, "job"); !errors.Is(err, gocronlock.ErrLocked) {
			t.Fatalf("tick %d: another replica's Lock between ticks = %v, want ErrLocked", tick, err)
		}
	}
	endJob()
	if !waitFor(10*time.Second, func() bool { return !held(t, f, "gocron:job") }) {
		t.Fatal("job lock kept after the job ended")
	}
	if released := time.Now(); released.Before(last.Add(gap)) {
		t.Fatalf("released %v after the last tick, before the next would have come (%v)", released.Sub(last), gap)
	}
	if _, err := there.Lock(otherCtx, "job"); err != nil {
		t.Fatalf("Lock after the job ended = %v", err)
	}
}

// token is the fencing token of the holder of name, 0 when it is free.
func token(t *testing.T, f *memlock.Factory, name string) uint64 {
	t.Helper()
	info, err := f.Inspect(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	if len(info.Holders) == 0 {
		return 0
	}
	return info.Holders[0].Token
}

// The replica that ran a job keeps it: its next tick runs on the lock it
// kept, never released in between (the token does not change), so a
// replica firing at the same moment cannot slip in. A kept lock lost
// between ticks is not run on: the owner's next tick competes for a new
// one like any replica's.
func TestOwnerKeepsJobLock(t *testing.T) {
	f := memlock.NewFactory(memlock.WithLogger(nil))
	defer f.Close()
	here := gocronlock.New(f.AsLocker(), gocronlock.WithMinHold(0))
	defer here.Close()
	there := gocronlock.New(f.AsLocker(), gocronlock.WithMinHold(0))
	defer there.Close()
	hereJob, endHere := context.WithCancel(context.Background()) // gocron's job contexts
	defer endHere()
	thereJob, endThere := context.WithCancel(context.Background())
	defer endThere()
	run := func(l *gocronlock.Locker, ctx context.Context) error {
		t.Helper()
		lk, err := l.Lock(ctx, "job")
		if err != nil {
			return err
		}
		if err := lk.Unlock(ctx); err != nil {
			t.Fatalf("Unlock = %v", err)
		}
		return nil
	}
	if err := run(here, hereJob); err != nil {
		t.Fatal(err)
	}
	first := token(t, f, "gocron:job")
	for tick := range 3 {
		if err := run(there, thereJob); !errors.Is(err, gocronlock.ErrLocked) {
			t.Fatalf("tick %d: the other replica's Lock = %v, want ErrLocked", tick, err)
		}
		if err := run(here, hereJob); err != nil {
			t.Fatalf("tick %d: the owner's Lock = %v", tick, err)
		}
		if got := token(t, f, "gocron:job"); got != first {
			t.Fatalf("tick %d: the owner ran on token %d, want the kept lock's %d", tick, got, first)
		}
	}

	// Lost between ticks, free: the owner takes a new lock.
	f.ForceLoss("gocron:job")
	if err := run(here, hereJob); err != nil {
		t.Fatalf("Lock after the kept lock was lost = %v", err)
	}
	if got := token(t, f, "gocron:job"); got <= first {
		t.Fatalf("after a loss the owner ran on token %d, want a new lock (> %d)", got, first)
	}
	// Lost, and another replica took the job first: it is that one's now.
	f.ForceLoss("gocron:job")
	if err := run(there, thereJob); err != nil {
		t.Fatalf("the other replica's Lock after the loss = %v", err)
	}
	for range 2 {
		if err := run(here, hereJob); !errors.Is(err, gocronlock.ErrLocked) {
			t.Fatalf("the former owner's Lock = %v, want ErrLocked", err)
		}
		if err := run(there, thereJob); err != nil {
			t.Fatalf("the new owner's Lock = %v", err)
		}
	}
}

// A kept lock the store cannot confirm (its Extend fails, not with a loss)
// skips the tick with that failure, not contention, and stays kept: the
// next tick that the store answers runs on it.
func TestKeptLockUnconfirmed(t *testing.T) {
	f := memlock.NewFactory()
	defer f.Close()
	l := &flakyLocker{l: f.AsLocker()}
	here := gocronlock.New(l, gocronlock.WithMinHold(0))
	defer here.Close()
	job, end := context.WithCancel(context.Background())
	defer end()
	for tick := range 3 {
		l.down.Store(tick == 1)
		lk, err := here.Lock(job, "job")
		if tick == 1 {
			if err == nil || errors.Is(err, lock.ErrLocked) || !errors.Is(err, errStoreDown) {
				t.Fatalf("Lock with the store down = %v, want its failure, not contention", err)
			}
			if token(t, f, "gocron:job") == 0 {
				t.Fatal("the kept lock was released when the store did not answer")
			}
			continue
		}
		if err != nil {
			t.Fatalf("tick %d: Lock = %v", tick, err)
		}
		lk.Unlock(job)
	}
	if n := l.acquires.Load(); n != 1 {
		t.Fatalf("%d acquires, want 1: the owner runs on its kept lock", n)
	}
}

var errStoreDown = errors.New("store unreachable")

// flakyLocker's holders fail to extend while down is set, as a lease
// backend's do when their store does not answer.
type flakyLocker struct {
	l        lock.Locker
	down     atomic.Bool
	acquires atomic.Int32
}

func (f *flakyLocker) Acquire(ctx context.Context, name string) (lock.Holder, error) {
	f.acquires.Add(1)
	h, err := f.l.Acquire(ctx, name)
	if err != nil {
		return nil, err
	}
	return flakyHolder{h, f}, nil
}

type flakyHolder struct {
	lock.Holder
	f *flakyLocker
}

func (h flakyHolder) Extend(ctx context.Context) error {
	if h.f.down.Load() {
		return errStoreDown
	}
	return h.Holder.(lock.Extender).Extend(ctx)
}
