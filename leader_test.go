package lock_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/backend"
	"github.com/ubgo/lock/internal/testenv"
)

// toyStore is an in-test lock server shared by several clients, with the
// failure modes the pattern helpers must survive. The root module takes no
// dependencies, so its tests cannot use memlock.
type toyStore struct {
	mu       sync.Mutex
	held     map[string]*toyHolder
	tokens   map[string]uint64
	failures []error // returned by the next Acquire calls, in order
	acquires int
}

var (
	errToyLocked  = fmt.Errorf("toy: %w", lock.ErrLocked)
	errToyLeaseUp = fmt.Errorf("toy: lease ran out: %w", lock.ErrLockLost)
)

func newToyStore() *toyStore {
	return &toyStore{held: map[string]*toyHolder{}, tokens: map[string]uint64{}}
}

type toyHolder struct {
	s     *toyStore
	name  string
	owner string
	token uint64
	since time.Time
	state *backend.State
}

// locker returns a client of the store whose holders record owner.
func (s *toyStore) locker(owner string) lock.Locker {
	return lock.LockerFunc(func(ctx context.Context, name string) (lock.Holder, error) {
		if err := lock.ValidateName(name); err != nil {
			return nil, err
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		s.acquires++
		if len(s.failures) > 0 {
			err := s.failures[0]
			s.failures = s.failures[1:]
			return nil, err
		}
		if s.held[name] != nil {
			return nil, errToyLocked
		}
		s.tokens[name]++
		h := &toyHolder{s: s, name: name, owner: owner, token: s.tokens[name], since: time.Now(), state: backend.NewState()}
		s.held[name] = h
		return h, nil
	})
}

func (s *toyStore) fail(errs ...error) {
	s.mu.Lock()
	s.failures = append(s.failures, errs...)
	s.mu.Unlock()
}

func (s *toyStore) holder(name string) *toyHolder {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.held[name]
}

// loseLease makes name's holder lose its lock the way a lease backend with
// a safety margin does: the holder is told first, and the server frees the
// name only once the holder has let go. It returns the holder, or nil.
func (s *toyStore) loseLease(name string) *toyHolder {
	h := s.holder(name)
	if h != nil {
		h.state.Lose(errToyLeaseUp)
	}
	return h
}

// crash frees name on the server before its holder can know, as a dead
// Postgres session or an expired lease without margin does.
func (s *toyStore) crash(name string) *toyHolder {
	s.mu.Lock()
	h := s.held[name]
	delete(s.held, name)
	s.mu.Unlock()
	if h != nil {
		h.state.Lose(errToyLeaseUp)
	}
	return h
}

func (s *toyStore) Inspect(ctx context.Context, name string) (lock.Info, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	info := lock.Info{Name: name}
	if h := s.held[name]; h != nil {
		info.Limit = 1
		info.Holders = []lock.HolderInfo{{Token: h.token, Owner: h.owner, Since: h.since}}
	}
	return info, nil
}

func (h *toyHolder) Release() error {
	h.s.mu.Lock()
	if h.s.held[h.name] == h {
		delete(h.s.held, h.name)
	}
	h.s.mu.Unlock()
	h.state.End()
	return h.state.Err()
}
func (h *toyHolder) Token() uint64         { return h.token }
func (h *toyHolder) Done() <-chan struct{} { return h.state.Done() }
func (h *toyHolder) Err() error            { return h.state.Err() }

// overlap counts the leaders working at once.
type overlap struct {
	inside atomic.Int32
	worst  atomic.Int32
}

func (o *overlap) enter() {
	n := o.inside.Add(1)
	for {
		w := o.worst.Load()
		if n <= w || o.worst.CompareAndSwap(w, n) {
			return
		}
	}
}
func (o *overlap) leave() { o.inside.Add(-1) }

func quiet() lock.LeadOption { return lock.WithLeadLogger(nil) }

// term is one leader's tenure as seen by the work function.
type term struct {
	replica int
	epoch   uint64
	ctx     context.Context
	resign  chan struct{} // closing it makes work return nil
}

// campaign runs n replicas of Lead on the store; the work of each reports
// its term on terms and runs, inside the overlap checker, until its context
// is cancelled or it is told to resign.
func campaign(t *testing.T, s *toyStore, n int, name string, o *overlap) (terms chan term, stop []context.CancelFunc, wait func()) {
	terms = make(chan term, 100)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		ctx, cancel := context.WithCancel(context.Background())
		stop = append(stop, cancel)
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := lock.Lead(ctx, s.locker(fmt.Sprint("replica-", i)), name, func(ctx context.Context, epoch uint64) error {
				o.enter()
				defer o.leave()
				tm := term{replica: i, epoch: epoch, ctx: ctx, resign: make(chan struct{})}
				terms <- tm
				select {
				case <-ctx.Done():
				case <-tm.resign:
				}
				// Finishing the current step takes a while; a successor
				// that started now would overlap.
				time.Sleep(15 * time.Millisecond)
				return nil
			}, lock.WithLeadRetry(5*time.Millisecond), quiet())
			if !errors.Is(err, context.Canceled) {
				t.Errorf("replica %d: Lead = %v, want context.Canceled", i, err)
			}
		}()
	}
	t.Cleanup(func() {
		for _, c := range stop {
			c()
		}
		wg.Wait()
	})
	return terms, stop, wg.Wait
}

func nextTerm(t *testing.T, terms chan term) term {
	t.Helper()
	select {
	case tm := <-terms:
		return tm
	case <-time.After(10 * time.Second):
		t.Fatal("no leader elected within 10s")
		return term{}
	}
}

// TestLeadHandsOver drives leadership around three replicas through every
// way a term ends — work returns, the leader's ctx ends, the lease is lost —
// and checks that epochs rise and two leaders never work at once.
func TestLeadHandsOver(t *testing.T) {
	s := newToyStore()
	var o overlap
	terms, stop, _ := campaign(t, s, 3, "leader", &o)
	var last uint64
	stopped := map[int]bool{}
	for round := 0; round < 12; round++ {
		tm := nextTerm(t, terms)
		if tm.epoch <= last {
			t.Fatalf("round %d: epoch %d after %d", round, tm.epoch, last)
		}
		last = tm.epoch
		if h := s.holder("leader"); h == nil || h.token != tm.epoch || h.owner != fmt.Sprint("replica-", tm.replica) {
			t.Fatalf("round %d: the store's holder %+v is not the working leader %+v", round, h, tm)
		}
		switch {
		case round%3 == 0:
			close(tm.resign)
		case round%3 == 1:
			h := s.loseLease("leader")
			<-tm.ctx.Done()
			if cause := context.Cause(tm.ctx); !errors.Is(cause, lock.ErrLockLost) || cause != h.Err() {
				t.Fatalf("work ctx cause = %v, want the holder's loss", cause)
			}
		case round == 8 && !stopped[tm.replica]:
			stopped[tm.replica] = true
			stop[tm.replica]() // the leader shuts down; the other two go on
			<-tm.ctx.Done()
		default:
			close(tm.resign)
		}
	}
	if w := o.worst.Load(); w != 1 {
		t.Fatalf("%d leaders worked at once", w)
	}
}

// TestLeadCrash: a server that frees the name before the holder knows (the
// unfenced window) still hands leadership over, cancels the old work, and
// the epoch tells the two apart.
func TestLeadCrash(t *testing.T) {
	s := newToyStore()
	var o overlap
	terms, _, _ := campaign(t, s, 2, "leader", &o)
	first := nextTerm(t, terms)
	s.crash("leader")
	second := nextTerm(t, terms)
	<-first.ctx.Done()
	if second.epoch <= first.epoch {
		t.Fatalf("epoch %d after %d", second.epoch, first.epoch)
	}
	if !errors.Is(context.Cause(first.ctx), lock.ErrLockLost) {
		t.Fatalf("old leader's cause = %v", context.Cause(first.ctx))
	}
	fence := lock.NewMemoryFence()
	if err := fence.RejectIfStale(context.Background(), "out", second.epoch); err != nil {
		t.Fatal(err)
	}
	if err := fence.RejectIfStale(context.Background(), "out", first.epoch); !errors.Is(err, lock.ErrStaleToken) {
		t.Fatalf("the deposed leader's write = %v, want ErrStaleToken", err)
	}
}

func TestLeadRetriesTransientErrors(t *testing.T) {
	s := newToyStore()
	boom := errors.New("connection reset")
	s.fail(boom, boom, boom)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var buf syncBuffer
	log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	elected := make(chan uint64, 1)
	errc := make(chan error, 1)
	go func() {
		errc <- lock.Lead(ctx, s.locker("a"), "leader", func(ctx context.Context, epoch uint64) error {
			elected <- epoch
			<-ctx.Done()
			return ctx.Err()
		}, lock.WithLeadRetry(time.Millisecond), lock.WithLeadMaxBackoff(4*time.Millisecond), lock.WithLeadLogger(log))
	}()
	select {
	case epoch := <-elected:
		if epoch != 1 {
			t.Fatalf("epoch %d", epoch)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("not elected after transient errors")
	}
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("Lead = %v", err)
	}
	if s.holder("leader") != nil {
		t.Fatal("lock not released after ctx ended")
	}
	out := buf.String()
	for _, want := range []string{"campaign failed", "connection reset", "elected leader", "epoch=1", "stepped down"} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %q:\n%s", want, out)
		}
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}
func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// TestLeadWorkFailure: a failing work steps down and campaigns again.
func TestLeadWorkFailure(t *testing.T) {
	s := newToyStore()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var terms atomic.Int32
	done := make(chan struct{})
	go func() {
		lock.Lead(ctx, s.locker("a"), "leader", func(ctx context.Context, epoch uint64) error {
			if s.holder("leader") == nil {
				t.Error("work runs without the lock")
			}
			if terms.Add(1) == 3 {
				close(done)
				<-ctx.Done()
			}
			return errors.New("work failed")
		}, lock.WithLeadRetry(time.Millisecond), lock.WithLeadMaxBackoff(2*time.Millisecond), quiet())
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatalf("only %d terms after failures", terms.Load())
	}
}

func TestLeadStopsOnPermanentErrors(t *testing.T) {
	work := func(context.Context, uint64) error { return nil }
	ctx := context.Background()
	for _, perm := range []error{lock.ErrClosed, lock.ErrLimitMismatch, lock.ErrInvalidOption} {
		s := newToyStore()
		s.fail(fmt.Errorf("toy: %w", perm))
		if err := lock.Lead(ctx, s.locker("a"), "leader", work, quiet()); !errors.Is(err, perm) {
			t.Errorf("Lead with %v = %v", perm, err)
		}
	}
	s := newToyStore()
	for what, err := range map[string]error{
		"bad name":    lock.Lead(ctx, s.locker("a"), "", work, quiet()),
		"nil work":    lock.Lead(ctx, s.locker("a"), "x", nil, quiet()),
		"nil locker":  lock.Lead(ctx, nil, "x", work, quiet()),
		"zero retry":  lock.Lead(ctx, s.locker("a"), "x", work, lock.WithLeadRetry(0), quiet()),
		"neg backoff": lock.Lead(ctx, s.locker("a"), "x", work, lock.WithLeadMaxBackoff(-1), quiet()),
	} {
		if !errors.Is(err, lock.ErrInvalidOption) && !errors.Is(err, lock.ErrInvalidName) {
			t.Errorf("%s: Lead = %v", what, err)
		}
	}
	if s.acquires != 0 {
		t.Errorf("invalid input reached the backend %d times", s.acquires)
	}
}

func TestLeadFollowerStopsOnCancel(t *testing.T) {
	s := newToyStore()
	other, _ := s.locker("b").Acquire(context.Background(), "leader")
	defer other.Release()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		errc <- lock.Lead(ctx, s.locker("a"), "leader", func(context.Context, uint64) error {
			t.Error("a follower worked")
			return nil
		}, lock.WithLeadRetry(time.Hour), quiet())
	}()
	testenv.Eventually(t, 10*time.Second, "first campaign", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.acquires > 1
	})
	cancel()
	select {
	case err := <-errc:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Lead = %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a follower waiting its retry interval did not stop on cancel")
	}
}

func TestLeadPanicReleases(t *testing.T) {
	s := newToyStore()
	defer func() {
		if r := recover(); r != "boom" {
			t.Fatalf("recovered %v", r)
		}
		if s.holder("leader") != nil {
			t.Fatal("a panicking leader kept the lock")
		}
	}()
	lock.Lead(context.Background(), s.locker("a"), "leader", func(context.Context, uint64) error { panic("boom") }, quiet())
}

func TestCurrentLeader(t *testing.T) {
	ctx := context.Background()
	s := newToyStore()
	if _, ok, err := lock.CurrentLeader(ctx, s, "leader"); ok || err != nil {
		t.Fatalf("nobody leads: ok %v err %v", ok, err)
	}
	h, _ := s.locker("replica-7").Acquire(ctx, "leader")
	info, ok, err := lock.CurrentLeader(ctx, s, "leader")
	if !ok || err != nil || info.Owner != "replica-7" || info.Token != h.Token() {
		t.Fatalf("CurrentLeader = %+v %v %v", info, ok, err)
	}
	many := inspectorFunc(func(context.Context, string) (lock.Info, error) {
		return lock.Info{Limit: 3, Holders: []lock.HolderInfo{{Token: 4}, {Token: 9, Owner: "newest"}, {Token: 2}}}, nil
	})
	if info, _, _ := lock.CurrentLeader(ctx, many, "x"); info.Owner != "newest" {
		t.Fatalf("with several holders, leader = %+v; want the highest epoch", info)
	}
	boom := errors.New("down")
	failing := inspectorFunc(func(context.Context, string) (lock.Info, error) { return lock.Info{}, boom })
	if _, ok, err := lock.CurrentLeader(ctx, failing, "x"); ok || !errors.Is(err, boom) {
		t.Fatalf("failing inspector: %v %v", ok, err)
	}
	if _, _, err := lock.CurrentLeader(ctx, nil, "x"); !errors.Is(err, lock.ErrInvalidOption) {
		t.Fatalf("nil inspector: %v", err)
	}
}

type inspectorFunc func(ctx context.Context, name string) (lock.Info, error)

func (f inspectorFunc) Inspect(ctx context.Context, name string) (lock.Info, error) {
	return f(ctx, name)
}

// extender is a holder whose Extend fails on demand.
type extender struct {
	*toyHolder
	mu      sync.Mutex
	extends int
	active  int // Extends in flight
	fail    error
	block   bool
}

func (e *extender) Extend(ctx context.Context) error {
	e.mu.Lock()
	e.extends++
	e.active++
	err, block := e.fail, e.block
	e.mu.Unlock()
	defer func() {
		e.mu.Lock()
		e.active--
		e.mu.Unlock()
	}()
	if block {
		<-ctx.Done()
		time.Sleep(5 * time.Millisecond) // as a request does after its deadline
		return ctx.Err()
	}
	return err
}

func (e *extender) count() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.extends
}

func newExtender(t *testing.T) *extender {
	h, err := newToyStore().locker("a").Acquire(context.Background(), "x")
	if err != nil {
		t.Fatal(err)
	}
	return &extender{toyHolder: h.(*toyHolder)}
}

func TestKeepAlive(t *testing.T) {
	t.Run("renews until cancelled", func(t *testing.T) {
		e := newExtender(t)
		ctx, cancel := lock.KeepAlive(context.Background(), e, time.Millisecond)
		testenv.Eventually(t, 10*time.Second, "three renewals", func() bool { return e.count() >= 3 })
		if ctx.Err() != nil {
			t.Fatal("cancelled while renewals succeed")
		}
		cancel()
		n := e.count()
		time.Sleep(20 * time.Millisecond)
		if e.count() != n {
			t.Fatal("renewing after cancel returned")
		}
		if e.Err() != nil || closedChan(e.Done()) {
			t.Fatal("cancel touched the lock")
		}
	})
	t.Run("cancel waits for the renewal in flight", func(t *testing.T) {
		e := newExtender(t)
		e.block = true // each Extend lasts until its context ends, and a little longer
		_, cancel := lock.KeepAlive(context.Background(), e, 100*time.Millisecond)
		testenv.Eventually(t, 10*time.Second, "an Extend in flight", func() bool {
			e.mu.Lock()
			defer e.mu.Unlock()
			return e.active > 0
		})
		cancel()
		e.mu.Lock()
		active := e.active
		e.mu.Unlock()
		if active != 0 {
			t.Fatalf("cancel returned with %d Extend calls in flight; a Release after it would race them", active)
		}
	})
	t.Run("lost on extend", func(t *testing.T) {
		e := newExtender(t)
		e.fail = errToyLeaseUp
		ctx, cancel := lock.KeepAlive(context.Background(), e, time.Millisecond)
		defer cancel()
		<-ctx.Done()
		if context.Cause(ctx) != errToyLeaseUp {
			t.Fatalf("cause = %v", context.Cause(ctx))
		}
	})
	t.Run("renewal error counts as loss", func(t *testing.T) {
		e := newExtender(t)
		boom := errors.New("timeout")
		e.fail = boom
		ctx, cancel := lock.KeepAlive(context.Background(), e, time.Millisecond)
		defer cancel()
		<-ctx.Done()
		if c := context.Cause(ctx); !errors.Is(c, lock.ErrLockLost) || !errors.Is(c, boom) {
			t.Fatalf("cause = %v", c)
		}
	})
	t.Run("slow extend counts as loss", func(t *testing.T) {
		e := newExtender(t)
		e.block = true
		ctx, cancel := lock.KeepAlive(context.Background(), e, 5*time.Millisecond)
		defer cancel()
		<-ctx.Done()
		if c := context.Cause(ctx); !errors.Is(c, lock.ErrLockLost) || !errors.Is(c, context.DeadlineExceeded) {
			t.Fatalf("cause = %v", c)
		}
	})
	t.Run("watches a holder without a lease", func(t *testing.T) {
		h, _ := newToyStore().locker("a").Acquire(context.Background(), "x")
		ctx, cancel := lock.KeepAlive(context.Background(), h, time.Millisecond)
		defer cancel()
		h.(*toyHolder).state.Lose(errToyLeaseUp)
		<-ctx.Done()
		if context.Cause(ctx) != errToyLeaseUp {
			t.Fatalf("cause = %v", context.Cause(ctx))
		}
		h2, _ := newToyStore().locker("a").Acquire(context.Background(), "x")
		ctx, cancel = lock.KeepAlive(context.Background(), h2, time.Millisecond)
		defer cancel()
		h2.Release()
		<-ctx.Done()
		if !errors.Is(context.Cause(ctx), lock.ErrLockLost) {
			t.Fatalf("after release, cause = %v", context.Cause(ctx))
		}
	})
	t.Run("bad input", func(t *testing.T) {
		for _, h := range []lock.Holder{nil, newExtender(t)} {
			ctx, cancel := lock.KeepAlive(context.Background(), h, 0)
			cancel()
			if !errors.Is(context.Cause(ctx), lock.ErrInvalidOption) {
				t.Errorf("cause = %v", context.Cause(ctx))
			}
		}
	})
}

func closedChan(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// ExampleLead elects one of three replicas; each leader works until its
// context ends, here by resigning after one unit of work.
func ExampleLead() {
	s := newToyStore() // in production: a backend factory's AsLocker()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var mu sync.Mutex
	var epochs []uint64
	var wg sync.WaitGroup
	for r := 0; r < 3; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lock.Lead(ctx, s.locker(fmt.Sprint("replica-", r)), "cache-warmer", func(ctx context.Context, epoch uint64) error {
				mu.Lock()
				defer mu.Unlock()
				epochs = append(epochs, epoch) // fence side effects with epoch
				if len(epochs) == 3 {
					cancel()
				}
				return nil // resign: step down and campaign again
			}, lock.WithLeadRetry(time.Millisecond), lock.WithLeadLogger(nil))
		}()
	}
	wg.Wait()
	sort.Slice(epochs, func(i, j int) bool { return epochs[i] < epochs[j] })
	fmt.Println("epochs:", epochs[:3])
	// Output:
	// epochs: [1 2 3]
}
