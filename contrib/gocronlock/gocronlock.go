// Package gocronlock runs gocron v2 jobs once across replicas, on any lock
// backend of the family (or any lock.Locker): New is a gocron.Locker whose
// job lock stays with the replica that first ran the job, which runs every
// tick while it lives, so replicas whose timers fire apart do not run the
// same interval twice, and NewElector a gocron.Elector for schedulers
// where one replica runs every job.
//
//	locks := redislock.NewFactory(rdb, redislock.WithTTL(10*time.Minute))
//	s, err := gocron.NewScheduler(
//		gocron.WithDistributedLocker(gocronlock.New(locks.AsLocker())),
//	)
//
// A job learns of a lost lock through JobContext and reads its fencing token
// through JobHolder; Lock rejects job names gocron made from a function
// name (ErrUnnamedJob), and its errors tell contention (ErrLocked) from a
// failing backend. The guide covers timer skew, long jobs, names, errors
// and when exclusion holds:
// https://github.com/ubgo/lock/blob/main/docs/guides/gocronlock.md
package gocronlock

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"strings"
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
	pending map[*time.Timer]*hold // delayed releases
	wg      sync.WaitGroup        // delayed releases that are running
	warned  map[string]bool       // rejected names already logged
	jobs    map[jobKey]*job       // the jobs whose ticks this Locker has seen
}

// New returns a gocron.Locker that takes its locks from l. l must not
// wait (no WithWait): a replica that waited for the winner to finish would
// then run the same tick again. A Locker that cannot work — an invalid
// option, a nil l, or an l that reports (lock.Configured) an invalid
// configuration or WithWait — is reported by Err, logged once at Error
// level here, and returned by every Lock, so no job runs.
func New(l lock.Locker, opts ...Option) *Locker {
	c := resolve(opts)
	a := &Locker{l: l, cfg: c, err: errors.Join(c.errs...), pending: map[*time.Timer]*hold{}, warned: map[string]bool{}, jobs: map[jobKey]*job{}}
	if l == nil {
		a.err = errors.Join(a.err, fmt.Errorf("gocronlock: %w: nil lock.Locker", lock.ErrInvalidOption))
	}
	if bc, ok := l.(lock.Configured); ok {
		switch o, err := bc.Config(); {
		case err != nil:
			a.err = errors.Join(a.err, fmt.Errorf("gocronlock: lock.Locker configuration: %w", err))
		case o.Wait:
			a.err = errors.Join(a.err, fmt.Errorf("gocronlock: %w: lock.Locker built with WithWait: a replica that waited would run the tick again", lock.ErrInvalidOption))
		}
	}
	if a.err != nil {
		a.cfg.log().Error("gocronlock: Locker unusable, no job will run", "err", a.err)
	}
	return a
}

// Err reports why the Locker cannot work (see New), or nil when it can.
// Every Lock returns this error; check it at start-up.
func (a *Locker) Err() error { return a.err }

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
	j, kept := a.tick(ctx, key)
	r := &run{a: a, ctx: ctx, key: key, j: j, lost: make(chan struct{}), ended: make(chan struct{})}
	// The run registers under gocron's ctx; the acquires get a bounded one.
	// Holders of the family do not depend on it once acquired.
	actx, cancel := context.WithTimeout(ctx, a.cfg.lockTimeout)
	defer cancel()
	if err := r.takeTick(actx, name); err != nil {
		if kept != nil {
			a.restore(ctx, j, kept) // still the job's owner
		}
		return nil, err
	}
	if err := r.takeJob(actx, name, kept); err != nil {
		if r.tick != nil {
			// Nobody ran this tick here; a replica that fires later may.
			_ = r.tick.release()
		}
		return nil, err
	}
	r.locked = time.Now()
	if a.cfg.extendEvery > 0 {
		r.watch(r.job)
	}
	runs.add(r)
	return r, nil
}

// takeTick takes the lock of the tick (WithTickResolution), if any.
func (r *run) takeTick(ctx context.Context, name string) error {
	d := r.a.cfg.resolution
	if d <= 0 {
		return nil
	}
	// PeriodKey truncates; shifted by d/2 it rounds, so that replicas
	// firing just before and just after a tick on a multiple of d (cron
	// times, clocks a little apart) meet on that tick's name.
	tick := lock.PeriodKey(name, time.Now().Add(d/2), d)
	h, err := r.a.l.Acquire(ctx, tick)
	if err != nil {
		return r.a.lockErr(r.ctx, r.key, "tick "+strings.TrimPrefix(tick, name+"@")+" already run", err)
	}
	r.tick = r.a.hold(h)
	return nil
}

// takeJob gives the run the job lock: kept, the one this replica kept
// from the job's last run, if the store confirms it is still held, else a
// new one.
func (r *run) takeJob(ctx context.Context, name string, kept *hold) error {
	a := r.a
	if kept != nil {
		switch held, err := kept.confirm(ctx); {
		case err != nil:
			// No answer: the tick is skipped, and the lock stays kept as
			// its holder has it (its own renewals or loss decide).
			a.restore(r.ctx, r.j, kept)
			return a.lockErr(r.ctx, r.key, "", fmt.Errorf("confirming the kept job lock: %w", err))
		case held:
			r.job = kept
			return nil
		}
		_ = kept.release() // lost since the last run: frees what is left
	}
	h, err := a.l.Acquire(ctx, name)
	if err != nil {
		return a.lockErr(r.ctx, r.key, "running elsewhere", err)
	}
	r.job = a.hold(h)
	return nil
}

// hold wraps h, renewing it with lock.KeepAlive when WithExtendEvery asks.
func (a *Locker) hold(h lock.Holder) *hold {
	hd := &hold{h: h}
	if a.cfg.extendEvery > 0 {
		hd.ctx, hd.stop = lock.KeepAlive(context.Background(), h, a.cfg.extendEvery)
	}
	return hd
}

// A hold is one lock of a run, with its renewals.
type hold struct {
	h    lock.Holder
	ctx  context.Context    // ends when a renewal fails; nil without renewals
	stop context.CancelFunc // stops the renewals; nil without them
}

// release stops the renewals, then gives the lock up.
func (h *hold) release() error {
	if h.stop != nil {
		h.stop()
	}
	return h.h.Release()
}

// confirm reports whether h, a job lock kept since the job's last run
// here, is still held, asking the store where it can: a lease
// (lock.Extender) is extended, which fails with lock.ErrLockLost once the
// lock is no longer this holder's. A lock without a lease (a Postgres
// session's, a kernel file lock) is held while its holder says so: its
// backend watches it (see that backend's guide on loss). err is a failure
// to get the store's answer, which leaves h as it was.
func (h *hold) confirm(ctx context.Context) (held bool, err error) {
	if h.h.Err() != nil || h.ctx != nil && h.ctx.Err() != nil {
		return false, nil // lost, or a renewal by WithExtendEvery failed
	}
	if ext, ok := h.h.(lock.Extender); ok {
		if err := ext.Extend(ctx); err != nil {
			if errors.Is(err, lock.ErrLockLost) {
				return false, nil
			}
			return false, err
		}
	}
	select {
	case <-h.h.Done():
		return false, nil
	default:
		return true, nil
	}
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
func (a *Locker) releaseAt(ctx context.Context, h *hold, at time.Time) error {
	d := time.Until(at)
	a.mu.Lock()
	if d <= 0 || a.closed {
		a.mu.Unlock()
		return h.release()
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
		if err := h.release(); err != nil {
			a.cfg.log().WarnContext(ctx, "gocronlock: delayed release failed", "err", err)
		}
	})
	a.pending[t] = h
	a.wg.Add(1)
	a.mu.Unlock()
	return nil
}

// Close releases at once every lock still kept after its run (the job
// locks of the jobs this replica runs, minimum holds, tick locks) and
// makes later Locks fail with lock.ErrClosed. Call it after the schedulers
// have shut down; a replica that fires for a tick this one has just run
// may then run it again, so in production it is fine never to call Close
// and let the holds end by themselves, at each job's would-be next tick.
func (a *Locker) Close() error {
	a.mu.Lock()
	a.closed = true
	var hs []*hold
	for t, h := range a.pending {
		// A timer that cannot be stopped has fired: its function is
		// waiting for a.mu and will release h itself.
		if t.Stop() {
			hs = append(hs, h)
			delete(a.pending, t)
			a.wg.Done()
		}
	}
	for k, j := range a.jobs {
		if j.kept != nil {
			hs = append(hs, j.kept)
			j.kept = nil
		}
		j.ended = true
		j.unwatch()
		delete(a.jobs, k)
	}
	a.mu.Unlock()
	var errs []error
	for _, h := range hs {
		if err := h.release(); err != nil && !errors.Is(err, lock.ErrLockLost) {
			errs = append(errs, err)
		}
	}
	a.wg.Wait()
	return errors.Join(errs...)
}

// A jobKey names one job of one scheduler. gocron gives each job its own
// context, passes it to every Lock of the job, and cancels it when the job
// is removed or updated or its scheduler stops.
type jobKey struct {
	ctx  context.Context
	name string
}

// A job is what the Locker has seen of one job's ticks in this process.
type job struct {
	key     jobKey
	last    time.Time     // the latest Lock
	gap     time.Duration // between the two latest Locks; 0 until seen
	kept    *hold         // the job lock of the last run, kept for the next
	minEnd  time.Time     // when kept's minimum hold ends
	ended   bool          // the job's context ended, or the Locker closed
	unwatch func() bool   // stops the watch on the job's context
}

// tick records a Lock of the job named key and hands over the job lock
// kept from the job's previous run here, if any: Lock runs this tick on it
// once the store confirms it, so the replica that runs a job keeps running
// it. It returns a nil job for a context that cannot say when the job ends
// (context.Background and the like): such runs are released after the
// minimum hold, as there is no end to bound a longer hold by.
func (a *Locker) tick(ctx context.Context, key string) (*job, *hold) {
	if ctx.Done() == nil || reflect.ValueOf(ctx).Kind() != reflect.Pointer {
		return nil, nil
	}
	now := time.Now()
	k := jobKey{ctx, key}
	a.mu.Lock()
	j := a.jobs[k]
	if j == nil {
		j = &job{key: k}
		a.jobs[k] = j
		j.unwatch = context.AfterFunc(ctx, func() { a.jobEnded(j) })
	} else {
		j.gap = now.Sub(j.last)
	}
	j.last = now
	kept := j.kept
	j.kept = nil
	a.mu.Unlock()
	return j, kept
}

// keep keeps h, the job lock of a run that ended, for the job's next tick
// here (see tick). A job that has ended has no next tick: its lock is
// released when that tick would have come (the latest Lock plus the gap
// between the two latest), and not before minEnd. Without a job (j nil),
// it is released at minEnd.
func (a *Locker) keep(ctx context.Context, j *job, h *hold, minEnd time.Time) error {
	if j == nil {
		return a.releaseAt(ctx, h, minEnd)
	}
	a.mu.Lock()
	if !j.ended && !a.closed {
		old := j.kept
		j.kept, j.minEnd = h, minEnd
		a.mu.Unlock()
		if old != nil { // not expected: a second run held the job lock
			_ = old.release()
		}
		return nil
	}
	end := j.last.Add(j.gap)
	a.mu.Unlock()
	return a.releaseAt(ctx, h, later(minEnd, end))
}

// restore keeps again the job lock that tick handed to a Lock which did
// not run the job, as the job's last run left it.
func (a *Locker) restore(ctx context.Context, j *job, h *hold) {
	a.mu.Lock()
	minEnd := j.minEnd
	a.mu.Unlock()
	if err := a.keep(ctx, j, h, minEnd); err != nil && !errors.Is(err, lock.ErrLockLost) {
		a.cfg.log().WarnContext(ctx, "gocronlock: release of a job lock failed", "job", j.key.name, "err", err)
	}
}

// jobEnded releases, when the job's next tick would have come, the lock
// kept for a job whose context ended.
func (a *Locker) jobEnded(j *job) {
	a.mu.Lock()
	if j.ended {
		a.mu.Unlock()
		return
	}
	j.ended = true
	if a.jobs[j.key] == j {
		delete(a.jobs, j.key)
	}
	kept, at := j.kept, later(j.minEnd, j.last.Add(j.gap))
	j.kept = nil
	a.mu.Unlock()
	if kept == nil {
		return
	}
	if err := a.releaseAt(context.Background(), kept, at); err != nil && !errors.Is(err, lock.ErrLockLost) {
		a.cfg.log().Warn("gocronlock: release of an ended job's lock failed", "job", j.key.name, "err", err)
	}
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// run is the gocron.Lock of one run of a job.
type run struct {
	a      *Locker
	ctx    context.Context // the job context gocron passed to Lock
	key    string
	j      *job  // the job's ticks in this process, or nil
	job    *hold // held while the job runs, then kept (see keep)
	tick   *hold // the tick's lock, or nil
	locked time.Time

	lost     chan struct{} // closed when a renewal reported the loss
	lostOnce sync.Once
	ended    chan struct{} // closed by Unlock: the run's watches stop
	unlock   sync.Once
}

// Unlock ends the run. gocron calls it, possibly with a context that is
// already cancelled, which it ignores: the releases are bounded by the
// backend. The job lock is kept for the job's next tick here (see the
// guide), or until that tick would have come once the job has ended, and
// the tick lock until twice the tick resolution after Lock, in the
// background. It reports a lock lost during the run.
func (r *run) Unlock(ctx context.Context) error {
	var err error
	r.unlock.Do(func() {
		close(r.ended)
		runs.remove(r)
		if r.tick != nil {
			if terr := r.a.releaseAt(ctx, r.tick, r.locked.Add(2*r.a.cfg.resolution)); terr != nil && !errors.Is(terr, lock.ErrLockLost) {
				r.a.cfg.log().WarnContext(ctx, "gocronlock: tick release failed", "job", r.key, "err", terr)
			}
		}
		if lerr := r.lostErr(); lerr != nil {
			_ = r.job.release() // the loss is the news; this only frees resources
			err = fmt.Errorf("gocronlock: job %q: %w", r.key, lerr)
			return
		}
		if err = r.a.keep(ctx, r.j, r.job, r.locked.Add(r.a.cfg.minHold)); err != nil {
			err = fmt.Errorf("gocronlock: job %q: %w", r.key, err)
		}
	})
	return err
}

// lostErr is the loss of the job lock, or nil while it is held.
func (r *run) lostErr() error {
	if err := r.job.h.Err(); err != nil {
		return err
	}
	select {
	case <-r.lost:
		return lock.ErrLockLost
	default:
		return nil
	}
}

// watch marks the run's lock lost when lock.KeepAlive gives up on h: a
// renewal failed, or the holder reported the loss. It stops when the run
// ends; the lock, kept, is checked again at the next Lock.
func (r *run) watch(h *hold) {
	go func() {
		select {
		case <-h.ctx.Done():
		case <-r.ended:
			return
		}
		cause := context.Cause(h.ctx)
		if !errors.Is(cause, lock.ErrLockLost) {
			return // stopped by release
		}
		r.lostOnce.Do(func() { close(r.lost) })
		r.a.cfg.log().Warn("gocronlock: job lock lost", "job", r.key, "err", cause)
	}()
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
// context derived from it does not count). Its Token is the job lock's
// fencing token: the same for every run while this replica keeps the job,
// larger once another replica has taken it. Its Done closes when the lock
// is lost (or released).
func JobHolder(ctx context.Context) lock.Holder {
	if r := runs.get(ctx); r != nil {
		return r.job.h
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
	// A lock lost already cancels cctx before it is returned.
	if err := r.lostErr(); err != nil {
		cancel(err)
	}
	go func() {
		select {
		case <-r.job.h.Done():
			if err := r.job.h.Err(); err != nil {
				cancel(err)
			}
		case <-r.lost:
			cancel(r.lostErr())
		case <-cctx.Done():
		case <-r.ended: // the lock outlives the run: stop watching it
		}
	}()
	return cctx, func() { cancel(nil) }
}
