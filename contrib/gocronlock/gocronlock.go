// Package gocronlock runs gocron v2 jobs once across replicas, on any lock
// backend of the family (or any lock.Locker).
//
//	locks := redislock.NewFactory(rdb, redislock.WithTTL(10*time.Minute))
//	s, err := gocron.NewScheduler(
//		gocron.WithDistributedLocker(gocronlock.New(locks.AsLocker())),
//	)
//
// gocron calls Locker.Lock(j.ctx, jobName) on every replica when a job's
// timer fires and runs the job only where Lock succeeds; it calls Unlock
// when the run ends. What this package adds to a bare lock:
//
//   - Timer skew. Replicas' timers fire at slightly different moments. A
//     short job released at once would let a replica that fires a few
//     hundred milliseconds late run the same tick again. The Locker keeps
//     each run's lock for at least WithMinHold after Lock (default 500ms),
//     releasing it in the background so gocron is not held up, and can also
//     lock each scheduled tick by name (WithTickResolution).
//   - Long jobs. The lock is held for as long as the job runs: the holders
//     of the family's AsLocker renew their leases themselves, and
//     WithExtendEvery renews holders that do not. A job learns that its lock
//     was lost through JobContext.
//   - Unlock works with the cancelled context gocron hands it at shutdown:
//     releases never depend on the caller's context.
//   - Names. A job without gocron.WithName is named after its function,
//     which two jobs can share; Lock rejects such names with ErrUnnamedJob
//     instead of letting the jobs silently share a lock.
//   - A bounded Lock. gocron calls Lock synchronously, with a job context
//     that has no deadline, and schedules the next run only once it
//     returns; every Lock gives up after WithLockTimeout (default 5s), so
//     a backend outage does not stall the job until it ends.
//   - Errors. Lock's error matches lock.ErrLocked (and ErrLocked) when
//     another replica has the run, and does not when the backend failed, so
//     a gocron.AfterLockError listener can tell the two apart.
//
// Elector implements gocron.Elector on the same backends, for schedulers
// where one replica runs every job.
//
// Exclusion holds under the backend's own assumptions (see its guide) and
// while replicas fire within WithMinHold of each other (or within half the
// tick resolution of a tick). A replica paused longer than that can still
// run a tick late; pair the job with the holder's fencing token
// (JobHolder(ctx).Token()) where a duplicate would do harm.
package gocronlock

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"sync"
	"time"

	"github.com/go-co-op/gocron/v2"

	"github.com/ubgo/lock"
)

// Errors. Contention errors from Lock match both ErrLocked and the
// backend's own ErrLocked (and so lock.ErrLocked).
var (
	// ErrLocked: another replica is running the job or has already run
	// this tick.
	ErrLocked = fmt.Errorf("gocronlock: %w", lock.ErrLocked)
	// ErrUnnamedJob: the job name looks like the name gocron gives a job
	// without gocron.WithName (its function's name), which is not a safe
	// lock key: every job built from the same function would share it.
	ErrUnnamedJob = fmt.Errorf("gocronlock: %w: job has no name of its own (gocron named it after its function); give it gocron.WithName", lock.ErrInvalidName)
	// ErrNotLeader: the Elector does not hold the leader lock. IsLeader's
	// error also matches lock.ErrLocked when another replica holds it.
	ErrNotLeader = errors.New("gocronlock: not the leader")
)

// Compile-time checks that the adapters fit gocron.
var (
	_ gocron.Locker  = (*Locker)(nil)
	_ gocron.Lock    = (*run)(nil)
	_ gocron.Elector = (*Elector)(nil)
)

// Locker adapts a lock.Locker to gocron.Locker. Create it with New; one
// Locker may serve any number of schedulers and jobs.
type Locker struct {
	l   lock.Locker
	cfg config
	err error

	mu      sync.Mutex
	closed  bool
	pending map[*time.Timer]lock.Holder // delayed releases
	wg      sync.WaitGroup              // delayed releases that are running
	warned  map[string]bool             // rejected names already logged
}

// New returns a gocron.Locker that takes its locks from l. l should not
// wait (no WithWait): a replica that waited for the winner to finish would
// then run the same tick again. An invalid option or a nil l is reported
// by every Lock.
func New(l lock.Locker, opts ...Option) *Locker {
	c := resolve(opts)
	a := &Locker{l: l, cfg: c, err: errors.Join(c.errs...), pending: map[*time.Timer]lock.Holder{}, warned: map[string]bool{}}
	if l == nil {
		a.err = errors.Join(a.err, fmt.Errorf("gocronlock: %w: nil lock.Locker", lock.ErrInvalidOption))
	}
	return a
}

// funcName matches the names runtime.FuncForPC gives functions, which
// gocron uses as a job's name when WithName is not set: an import path whose
// last element has its dots escaped, a dot, then an identifier, method or
// closure suffix (".func1", ".(*T).M", "-fm", "[...]").
var funcName = regexp.MustCompile(`^(?:[^/\s]+/)*[\p{L}\p{N}_~%+-]+\.[\p{L}_(][\p{L}\p{N}_.()*\[\]]*(?:-fm)?$`)

// tickSuffix matches what Lock appends to a job's name for its tick lock;
// a job name ending like this could meet another job's tick lock.
var tickSuffix = regexp.MustCompile(`@\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?Z$`)

// checkName rejects the job names that cannot be lock keys.
func (a *Locker) checkName(key string) error {
	var err error
	switch {
	case !a.cfg.anyName && funcName.MatchString(key):
		err = fmt.Errorf("%w: %q", ErrUnnamedJob, key)
	case tickSuffix.MatchString(key):
		err = fmt.Errorf("gocronlock: %w: job name %q ends like a tick suffix", lock.ErrInvalidName, key)
	default:
		return nil
	}
	a.mu.Lock()
	first := !a.warned[key]
	a.warned[key] = true
	a.mu.Unlock()
	if first {
		// gocron only reports the error to an AfterLockError listener; a
		// job that never runs deserves one line in the log.
		a.cfg.log().Warn("gocronlock: job will never run", "job", key, "err", err)
	}
	return err
}

// Lock takes the lock for one run of the job named key. It is called by
// gocron with the job's context and name; applications do not call it.
func (a *Locker) Lock(ctx context.Context, key string) (gocron.Lock, error) {
	if a.err != nil {
		return nil, a.err
	}
	a.mu.Lock()
	closed := a.closed
	a.mu.Unlock()
	if closed {
		return nil, fmt.Errorf("gocronlock: %w", lock.ErrClosed)
	}
	if err := a.checkName(key); err != nil {
		return nil, err
	}
	if ctx == nil {
		ctx = context.Background()
	}
	name := a.cfg.prefix + key
	r := &run{a: a, ctx: ctx, key: key, lost: make(chan struct{})}
	// The run registers under gocron's ctx; the acquires get a bounded one.
	// Holders of the family do not depend on it once acquired.
	actx, cancel := context.WithTimeout(ctx, a.cfg.lockTimeout)
	defer cancel()
	if d := a.cfg.resolution; d > 0 {
		tick := time.Now().Round(d).UTC().Format(time.RFC3339Nano)
		h, err := a.l.Acquire(actx, name+"@"+tick)
		if err != nil {
			return nil, a.lockErr(ctx, key, "tick "+tick+" already run", err)
		}
		r.tick = h
	}
	h, err := a.l.Acquire(actx, name)
	if err != nil {
		if r.tick != nil {
			// Nobody ran this tick here; a replica that fires later may.
			_ = r.tick.Release()
		}
		return nil, a.lockErr(ctx, key, "running elsewhere", err)
	}
	r.job, r.locked = h, time.Now()
	runs.add(r)
	if a.cfg.extendEvery > 0 {
		go r.extend(a.cfg.extendEvery)
	}
	return r, nil
}

// lockErr is Lock's error for err from Acquire; ctx is gocron's.
func (a *Locker) lockErr(ctx context.Context, key, why string, err error) error {
	switch {
	case errors.Is(err, lock.ErrLocked):
		return fmt.Errorf("%w: job %q: %s: %w", ErrLocked, key, why, err)
	case ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("gocronlock: job %q: no lock within %v (WithLockTimeout): %w", key, a.cfg.lockTimeout, err)
	}
	return fmt.Errorf("gocronlock: job %q: %w", key, err)
}

// releaseAt releases h at time at, in the background if that is still to
// come, and reports the error of a release done now.
func (a *Locker) releaseAt(ctx context.Context, h lock.Holder, at time.Time) error {
	d := time.Until(at)
	a.mu.Lock()
	if d <= 0 || a.closed {
		a.mu.Unlock()
		return h.Release()
	}
	var t *time.Timer
	t = time.AfterFunc(d, func() {
		a.mu.Lock()
		_, mine := a.pending[t]
		delete(a.pending, t)
		a.mu.Unlock()
		if !mine {
			return // Close stopped this timer and released h
		}
		defer a.wg.Done()
		if err := h.Release(); err != nil {
			a.cfg.log().WarnContext(ctx, "gocronlock: delayed release failed", "err", err)
		}
	})
	a.pending[t] = h
	a.wg.Add(1)
	a.mu.Unlock()
	return nil
}

// Close releases at once the locks still kept for their minimum hold and
// makes later Locks fail with lock.ErrClosed. Call it after the
// schedulers have shut down; a replica that fires for a tick this one has
// just run may then run it again, so in production it is fine never to
// call Close and let the holds end by themselves.
func (a *Locker) Close() error {
	a.mu.Lock()
	a.closed = true
	var hs []lock.Holder
	for t, h := range a.pending {
		// A timer that cannot be stopped has fired: its function is
		// waiting for a.mu and will release h itself.
		if t.Stop() {
			hs = append(hs, h)
			delete(a.pending, t)
			a.wg.Done()
		}
	}
	a.mu.Unlock()
	var errs []error
	for _, h := range hs {
		if err := h.Release(); err != nil && !errors.Is(err, lock.ErrLockLost) {
			errs = append(errs, err)
		}
	}
	a.wg.Wait()
	return errors.Join(errs...)
}

// run is the gocron.Lock of one run of a job.
type run struct {
	a      *Locker
	ctx    context.Context // the job context gocron passed to Lock
	key    string
	job    lock.Holder // held while the job runs, and MinHold after Lock
	tick   lock.Holder // the tick's lock, or nil
	locked time.Time

	lost     chan struct{} // closed when an Extend reported the loss
	lostOnce sync.Once
	unlock   sync.Once
}

// Unlock ends the run. gocron calls it, possibly with a context that is
// already cancelled, which it ignores: the releases are bounded by the
// backend. Locks that have not yet been held for their minimum time are
// released later in the background. It reports a lock lost during the run.
func (r *run) Unlock(ctx context.Context) error {
	var err error
	r.unlock.Do(func() {
		runs.remove(r)
		if r.tick != nil {
			if terr := r.a.releaseAt(ctx, r.tick, r.locked.Add(2*r.a.cfg.resolution)); terr != nil && !errors.Is(terr, lock.ErrLockLost) {
				r.a.cfg.log().WarnContext(ctx, "gocronlock: tick release failed", "job", r.key, "err", terr)
			}
		}
		if lerr := r.lostErr(); lerr != nil {
			_ = r.job.Release() // the loss is the news; this only frees resources
			err = fmt.Errorf("gocronlock: job %q: %w", r.key, lerr)
			return
		}
		err = r.a.releaseAt(ctx, r.job, r.locked.Add(r.a.cfg.minHold))
		if err != nil {
			err = fmt.Errorf("gocronlock: job %q: %w", r.key, err)
		}
	})
	return err
}

// lostErr is the loss of the job lock, or nil while it is held.
func (r *run) lostErr() error {
	if err := r.job.Err(); err != nil {
		return err
	}
	select {
	case <-r.lost:
		return lock.ErrLockLost
	default:
		return nil
	}
}

// extend renews the run's locks every d until they are released or lost.
func (r *run) extend(d time.Duration) {
	t := time.NewTicker(d)
	defer t.Stop()
	hs := []lock.Holder{r.job}
	if r.tick != nil {
		hs = append(hs, r.tick)
	}
	for range t.C {
		live := 0
		for _, h := range hs {
			select {
			case <-h.Done():
				continue
			default:
			}
			live++
			x, ok := h.(lock.Extender)
			if !ok {
				continue
			}
			ctx, cancel := context.WithTimeout(context.WithoutCancel(r.ctx), d)
			err := x.Extend(ctx)
			cancel()
			switch {
			case err == nil:
			case errors.Is(err, lock.ErrLockLost):
				if h == r.job {
					r.lostOnce.Do(func() { close(r.lost) })
					r.a.cfg.log().Warn("gocronlock: job lock lost", "job", r.key, "err", err)
				}
			default:
				r.a.cfg.log().Warn("gocronlock: extend failed", "job", r.key, "err", err)
			}
		}
		if live == 0 {
			return
		}
	}
}

// runs maps the context gocron passed to Lock, which is also the one it
// passes to a task whose first parameter is a context.Context, to the run
// that holds the job's lock. gocron gives the task the same context on every
// run and does not let a Locker cancel it, so this is how a task finds its
// lock.
var runs = registry{m: map[context.Context]*run{}}

type registry struct {
	mu sync.Mutex
	m  map[context.Context]*run
}

func (g *registry) add(r *run) {
	// gocron's job contexts are pointers (context.WithCancel). Other
	// contexts may be values that are equal across runs, or not hashable.
	if r.ctx == nil || reflect.ValueOf(r.ctx).Kind() != reflect.Pointer {
		return
	}
	g.mu.Lock()
	g.m[r.ctx] = r
	g.mu.Unlock()
}

func (g *registry) remove(r *run) {
	if r.ctx == nil || reflect.ValueOf(r.ctx).Kind() != reflect.Pointer {
		return
	}
	g.mu.Lock()
	if g.m[r.ctx] == r {
		delete(g.m, r.ctx)
	}
	g.mu.Unlock()
}

func (g *registry) get(ctx context.Context) *run {
	if ctx == nil || reflect.ValueOf(ctx).Kind() != reflect.Pointer {
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.m[ctx]
}

// JobHolder returns the lock a Locker holds for the running job whose
// context gocron passed in as ctx (the first parameter of a task
// func(ctx context.Context, ...)), or nil when there is none: the job is not
// running under a Locker, or ctx is not the one gocron gave the task (a
// context derived from it does not count). Its Token is the run's fencing
// token; its Done closes when the lock is lost (or released).
func JobHolder(ctx context.Context) lock.Holder {
	if r := runs.get(ctx); r != nil {
		return r.job
	}
	return nil
}

// JobContext returns a context derived from ctx that is cancelled, with a
// cause matching lock.ErrLockLost, when the running job's lock is lost.
// ctx must be the context gocron passed to the task, as for JobHolder;
// when there is no such lock the context is only cancelled with ctx or by
// cancel. gocron's own job context cannot be used for this: it is shared by
// every run of the job and cancelling it would unschedule the job.
//
//	gocron.NewTask(func(ctx context.Context) error {
//		ctx, cancel := gocronlock.JobContext(ctx)
//		defer cancel()
//		return export(ctx)
//	})
func JobContext(ctx context.Context) (context.Context, context.CancelFunc) {
	cctx, cancel := context.WithCancelCause(ctx)
	r := runs.get(ctx)
	if r == nil {
		return cctx, func() { cancel(nil) }
	}
	go func() {
		select {
		case <-r.job.Done():
			if err := r.job.Err(); err != nil {
				cancel(err)
			}
		case <-r.lost:
			cancel(r.lostErr())
		case <-cctx.Done():
		}
	}()
	return cctx, func() { cancel(nil) }
}
