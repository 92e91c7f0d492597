// Package locktest is the conformance suite for lock backends, in the spirit
// of testing/fstest: a backend's tests call Run, and the suite checks every
// guarantee of the family that can be observed through lock.Locker.
//
//	func TestConformance(t *testing.T) {
//		f := memlock.NewFactory()
//		locktest.Run(t, locktest.Backend{
//			New:       func(t testing.TB, opts ...lock.Option) lock.Locker { return f.AsLocker(opts...) },
//			ErrLocked: memlock.ErrLocked, ErrLockLost: memlock.ErrLockLost,
//			Wait: true, Semaphore: true,
//		})
//	}
package locktest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/backend"
	"github.com/ubgo/lock/internal/testenv"
)

// Backend describes the backend under test and the capabilities it claims;
// the suite tests each claimed capability and skips the rest.
type Backend struct {
	// New returns a client of the backend's shared store: lockers from two
	// calls must contend like two processes would. opts apply to every
	// Acquire of the returned locker. Required.
	New func(t testing.TB, opts ...lock.Option) lock.Locker
	// ErrLocked and ErrLockLost are the backend's own sentinels. Required.
	ErrLocked, ErrLockLost error

	Wait      bool // honours lock.WithWait
	Semaphore bool // honours lock.WithMaxConcurrent
	Extend    bool // holders implement lock.Extender
	// Shared says the backend honours lock.WithShared (with writer
	// preference); without it the suite checks that WithShared is
	// refused with lock.ErrInvalidOption, never ignored.
	Shared bool
	// TTL, if set, is a short lease the suite may use to watch a lease that
	// is not renewed run out; the backend honours lock.WithTTL and
	// lock.WithAutoRenew(false).
	TTL time.Duration
	// Inspector, if set, returns the inspector of the store New uses.
	Inspector func(t testing.TB) lock.Inspector
	// Lister, if set, returns the lister of the store New uses.
	Lister func(t testing.TB) lock.Lister
	// ListOwnedOnly says the Lister sees only holders that were given
	// lock.WithOwner or lock.WithMetadata (pglock): the List test gives
	// its holders an owner.
	ListOwnedOnly bool
	// ListEscapesLongNames says the Lister reports a name long enough to
	// be hashed by backend.Escape in that escaped form, because its store
	// keeps only the escaped key (redislock, etcdlock).
	ListEscapesLongNames bool
	// Lose, if set, makes h lose its lock the way the backend can lose one
	// in production (expired lease, killed session, removed marker).
	Lose func(t testing.TB, h lock.Holder)
	// LossBound is how long the backend may take to notice a loss caused
	// by Lose. Default 10s.
	LossBound time.Duration
	// Dial, if set, returns a locker like New's whose client talks to the
	// server at addr (host:port) instead, for the outage tests: the suite
	// gives it a closed port, and a server that accepts connections and
	// never answers. Backends that have no server to lose leave it nil.
	Dial func(t testing.TB, addr string, opts ...lock.Option) lock.Locker
	// Workers and Rounds size the mutual exclusion test. Defaults 8 and 25.
	Workers, Rounds int

	// Waiting, if set, reports how many Acquires are waiting on name in
	// the store New uses (it may count more, never fewer). Tests that need
	// a waiter to be waiting wait for it to say so, and fail if it never
	// does; without it they give the waiter a moment and hope.
	Waiting func(name string) int
	// NewFactory, if set, returns a factory with opts over the backend's
	// test defaults, for the Close and Config tests: of the
	// store New uses where there is one; closing it must not affect
	// lockers from New. Every backend's *Factory is one. A factory with a
	// method Waiting(name string) int counts its own waiters with it;
	// others are counted by Waiting.
	NewFactory func(t testing.TB, opts ...lock.Option) Factory
	// TokenFile, if set, returns the file that holds name's token counter
	// in the store New uses (file backends). The suite puts back an older
	// content and a torn one, as a host crash may, and checks that tokens
	// still never go back.
	TokenFile func(name string) string
	// Breaker, if set, returns a Breaker of the store New uses; the Break
	// tests then run, on every kind of lock the backend claims.
	Breaker func(t testing.TB) Breaker
	// Fence, if set, returns the backend's lock.Fence on the store New
	// uses, under the same key prefix or directory: the fence whose record
	// of the key equal to a name Break raises.
	Fence func(t testing.TB) lock.Fence
	// FIFO, if set, says the backend hands a mutex to its waiting Acquires
	// in the order they began to wait, and returns the locker of one
	// waiter, with opts: a client as another process would have one (New,
	// where the order holds between New's lockers too). The FIFO test
	// starts each waiter once Queued counts the one before it. Its
	// waiters all live in the test's process: a backend whose order holds
	// only within a process (flock, filelock) declares it too.
	FIFO func(t testing.TB, opts ...lock.Option) lock.Locker
	// Queued, if set, reports how many Acquires stand in the store's queue
	// of name, the queue whose order FIFO promises: exactly, where Waiting
	// may count more. Default Waiting.
	Queued func(name string) int
	// Name is the backend's name in lock.Event.Backend. If set, the
	// Observer test runs, giving lock.WithObserver to New.
	Name string
	// Clock, if set, returns a store whose time moves only when advance
	// is called (memlock with a ManualClock): lockers from newLocker
	// contend with each other like New's. The MaxHold test then checks
	// the bound by that clock too, to the tick.
	Clock func(t testing.TB) (newLocker func(opts ...lock.Option) lock.Locker, advance func(time.Duration))
}

// Factory is what the Close and Config tests need of a backend's factory.
type Factory interface {
	AsLocker(opts ...lock.Option) lock.Locker
	Err() error
	Close() error
}

// Run runs the conformance suite against b.
func Run(t *testing.T, b Backend) {
	t.Helper()
	if b.New == nil || b.ErrLocked == nil || b.ErrLockLost == nil {
		t.Fatal("locktest: Backend.New, ErrLocked and ErrLockLost are required")
	}
	if b.Workers == 0 {
		b.Workers = 8
	}
	if b.Rounds == 0 {
		b.Rounds = 25
	}
	if b.LossBound == 0 {
		b.LossBound = 10 * time.Second
	}
	s := &suite{Backend: b, run: fmt.Sprintf("%x", time.Now().UnixNano())}
	t.Run("Sentinels", s.sentinels)
	t.Run("Exclusion", s.exclusion)
	t.Run("MutualExclusion", s.mutualExclusion)
	t.Run("Tokens", s.tokens)
	t.Run("TokensAfterCrash", s.tokensAfterCrash)
	t.Run("Release", s.release)
	t.Run("ReleaseAfterCancel", s.releaseAfterCancel)
	t.Run("CancelledAcquire", s.cancelledAcquire)
	t.Run("WithLock", s.withLock)
	t.Run("WithLockPanic", s.withLockPanic)
	t.Run("Names", s.names)
	t.Run("BadOptions", s.badOptions)
	t.Run("Wait", s.wait)
	t.Run("WaitTimeout", s.waitTimeout)
	t.Run("WithWaitTimeout", s.withWaitTimeout)
	t.Run("WaitCancelMany", s.waitCancelMany)
	t.Run("FIFO", s.fifo)
	t.Run("Outage", s.outage)
	t.Run("Semaphore", s.semaphore)
	t.Run("SemaphoreExclusion", s.semaphoreExclusion)
	t.Run("LimitMismatch", s.limitMismatch)
	t.Run("Extend", s.extend)
	t.Run("LeaseExpiry", s.leaseExpiry)
	t.Run("Loss", s.loss)
	t.Run("MaxHold", s.maxHold)
	t.Run("MaxHoldClock", s.maxHoldClock)
	t.Run("AcquireAll", s.acquireAll)
	t.Run("AcquireAllAtomic", s.acquireAllAtomic)
	t.Run("AcquireAllLoss", s.acquireAllLoss)
	t.Run("AcquireAllLostWaiting", s.acquireAllLostWaiting)
	t.Run("AcquireAllNoDeadlock", s.acquireAllNoDeadlock)
	t.Run("Shared", s.shared)
	t.Run("Break", s.breakLock)
	t.Run("Inspect", s.inspect)
	t.Run("List", s.list)
	t.Run("Observer", s.observer)
	t.Run("Close", s.close)
	t.Run("Config", s.config)
	t.Run("Leaks", s.leaks)
}

type suite struct {
	Backend
	run string
}

// name returns a lock name unique to this test and process run, so that
// state left in a shared server by earlier runs cannot interfere.
func (s *suite) name(t testing.TB, suffix string) string {
	return "locktest/" + s.run + "/" + t.Name() + "/" + suffix
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func (s *suite) mustAcquire(t testing.TB, l lock.Locker, name string) lock.Holder {
	t.Helper()
	h, err := l.Acquire(ctxT(t), name)
	if err != nil {
		t.Fatalf("Acquire(%q): %v", name, err)
	}
	if h == nil {
		t.Fatalf("Acquire(%q) returned a nil Holder and no error", name)
	}
	return h
}

func (s *suite) mustRelease(t testing.TB, h lock.Holder) {
	t.Helper()
	if err := h.Release(); err != nil {
		t.Fatalf("Release: %v", err)
	}
}

func (s *suite) mustBeLocked(t testing.TB, l lock.Locker, name string) {
	t.Helper()
	h, err := l.Acquire(ctxT(t), name)
	if err == nil {
		h.Release()
		t.Fatalf("Acquire(%q) succeeded while the lock was held", name)
	}
	if !errors.Is(err, s.ErrLocked) || !errors.Is(err, lock.ErrLocked) {
		t.Fatalf("Acquire(%q) on a held lock: %v; want an error matching the backend's ErrLocked and lock.ErrLocked", name, err)
	}
}

func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// eventually waits for ch to close, failing after d.
func eventually(t testing.TB, ch <-chan struct{}, d time.Duration, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(d):
		t.Fatalf("%s: not within %v", what, d)
	}
}

func (s *suite) sentinels(t *testing.T) {
	if !errors.Is(s.ErrLocked, lock.ErrLocked) {
		t.Errorf("the backend's ErrLocked (%v) does not wrap lock.ErrLocked", s.ErrLocked)
	}
	if !errors.Is(s.ErrLockLost, lock.ErrLockLost) {
		t.Errorf("the backend's ErrLockLost (%v) does not wrap lock.ErrLockLost", s.ErrLockLost)
	}
}

// exclusion: two clients of the store, and the same client twice, conflict.
func (s *suite) exclusion(t *testing.T) {
	a, b := s.New(t), s.New(t)
	name := s.name(t, "x")
	h := s.mustAcquire(t, a, name)
	s.mustBeLocked(t, b, name)
	s.mustBeLocked(t, a, name)
	if closed(h.Done()) || h.Err() != nil {
		t.Fatalf("a held lock reports Done closed or Err %v", h.Err())
	}
	s.mustRelease(t, h)
	s.mustRelease(t, s.mustAcquire(t, b, name))
}

// checker detects overlapping critical sections and token inversions.
type checker struct {
	limit     int32
	inside    atomic.Int32
	mu        sync.Mutex
	lastToken uint64
	seen      map[uint64]bool
	errs      []string
}

func (c *checker) enter(token uint64, ordered bool) {
	if n := c.inside.Add(1); n > c.limit {
		c.fail("%d holders inside at once (limit %d)", n, c.limit)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if token == 0 {
		c.errs = append(c.errs, "token 0")
	}
	if c.seen[token] {
		c.errs = append(c.errs, fmt.Sprintf("token %d handed out twice", token))
	}
	c.seen[token] = true
	if ordered && token <= c.lastToken {
		c.errs = append(c.errs, fmt.Sprintf("token %d entered after token %d", token, c.lastToken))
	}
	c.lastToken = max(c.lastToken, token)
}

func (c *checker) leave() { c.inside.Add(-1) }

func (c *checker) fail(format string, args ...any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.errs = append(c.errs, fmt.Sprintf(format, args...))
}

func (c *checker) report(t testing.TB) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.errs) > 0 {
		if len(c.errs) > 10 {
			c.errs = append(c.errs[:10], fmt.Sprintf("... and %d more", len(c.errs)-10))
		}
		t.Fatalf("exclusion violated:\n%s", strings.Join(c.errs, "\n"))
	}
}

// hammer runs workers that each take name rounds times, checking that at
// most limit are inside at once.
func (s *suite) hammer(t *testing.T, name string, limit int, opts ...lock.Option) {
	c := &checker{limit: int32(limit), seen: map[uint64]bool{}}
	if s.Wait {
		opts = append(opts, lock.WithWait())
	}
	ctx := ctxT(t)
	var wg sync.WaitGroup
	errc := make(chan error, s.Workers)
	for w := 0; w < s.Workers; w++ {
		l := s.New(t, opts...) // a client per worker, like separate processes
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := 0; r < s.Rounds; {
				h, err := l.Acquire(ctx, name)
				if errors.Is(err, lock.ErrLocked) && ctx.Err() == nil {
					time.Sleep(time.Millisecond)
					continue
				}
				if err != nil {
					errc <- err
					return
				}
				c.enter(h.Token(), limit == 1)
				runtime.Gosched()
				time.Sleep(50 * time.Microsecond)
				c.leave()
				if err := h.Release(); err != nil {
					errc <- fmt.Errorf("release: %w", err)
					return
				}
				r++
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Error(err)
	}
	c.report(t)
	if want := s.Workers * s.Rounds; len(c.seen) != want {
		t.Errorf("%d critical sections recorded, want %d", len(c.seen), want)
	}
}

func (s *suite) mutualExclusion(t *testing.T) { s.hammer(t, s.name(t, "x"), 1) }

// tokens: tokens rise strictly from acquire to acquire, and a holder's
// token stays what it was at acquire while others contend for the name
// and, where it can, the holder extends its lease.
func (s *suite) tokens(t *testing.T) {
	a, b := s.New(t), s.New(t)
	name := s.name(t, "x")
	var last uint64
	for i := 0; i < 20; i++ {
		l, other := a, b
		if i%2 == 1 {
			l, other = b, a
		}
		h := s.mustAcquire(t, l, name)
		tok := h.Token()
		if tok == 0 || tok <= last {
			t.Fatalf("acquire %d: token %d after %d; want > 0 and strictly increasing", i, tok, last)
		}
		s.mustBeLocked(t, other, name)
		if e, ok := h.(lock.Extender); ok && s.Extend {
			if err := e.Extend(ctxT(t)); err != nil {
				t.Fatalf("Extend of a held lock: %v", err)
			}
		}
		if got := h.Token(); got != tok {
			t.Fatalf("acquire %d: Token changed while held: %d at acquire, %d after another client's attempt", i, tok, got)
		}
		last = tok
		s.mustRelease(t, h)
	}
}

func (s *suite) release(t *testing.T) {
	l := s.New(t)
	name := s.name(t, "x")
	h := s.mustAcquire(t, l, name)
	s.mustRelease(t, h)
	if err := h.Release(); err != nil {
		t.Fatalf("second Release: %v; want nil (Release is idempotent)", err)
	}
	if !closed(h.Done()) {
		t.Fatal("Done not closed after Release")
	}
	if err := h.Err(); err != nil {
		t.Fatalf("Err after a clean Release = %v, want nil", err)
	}
	// Concurrent releases of a fresh holder are safe too.
	h = s.mustAcquire(t, l, name)
	var wg sync.WaitGroup
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() { defer wg.Done(); h.Release() }()
	}
	wg.Wait()
	s.mustRelease(t, s.mustAcquire(t, l, name))
}

func (s *suite) releaseAfterCancel(t *testing.T) {
	l := s.New(t)
	name := s.name(t, "x")
	ctx, cancel := context.WithCancel(context.Background())
	h, err := l.Acquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	if closed(h.Done()) {
		t.Fatal("cancelling the Acquire context ended the lock")
	}
	s.mustBeLocked(t, s.New(t), name)
	s.mustRelease(t, h)
	s.mustRelease(t, s.mustAcquire(t, s.New(t), name))
}

func (s *suite) cancelledAcquire(t *testing.T) {
	l := s.New(t)
	name := s.name(t, "x")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	h, err := l.Acquire(ctx, name)
	if err == nil {
		h.Release()
		t.Fatal("Acquire with a cancelled context succeeded")
	}
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Acquire with a cancelled context: %v; want an error matching context.Canceled", err)
	}
	s.mustRelease(t, s.mustAcquire(t, s.New(t), name))
}

func (s *suite) withLock(t *testing.T) {
	l := s.New(t)
	name := s.name(t, "x")
	boom := errors.New("boom")
	ran := false
	var held lock.Holder
	err := lock.WithLock(ctxT(t), l, name, func(ctx context.Context) error {
		ran = true
		s.mustBeLocked(t, s.New(t), name)
		held, _ = lock.HolderFrom(ctx)
		if held == nil || held.Token() == 0 || held.Err() != nil {
			t.Errorf("lock.HolderFrom(fn's ctx) = %v; want the holder of %q", held, name)
		}
		return boom
	})
	if !ran || !errors.Is(err, boom) {
		t.Fatalf("WithLock = %v (ran %v); want fn's error", err, ran)
	}
	// Contention is reported, and fn does not run.
	h := s.mustAcquire(t, l, name)
	if reflect.TypeOf(held) != reflect.TypeOf(h) {
		t.Errorf("fn's holder is a %T; want the %T Acquire returns, with the backend's own methods", held, h)
	}
	err = lock.WithLock(ctxT(t), s.New(t), name, func(context.Context) error {
		t.Error("fn ran without the lock")
		return nil
	})
	if !errors.Is(err, s.ErrLocked) {
		t.Fatalf("WithLock on a held lock = %v; want ErrLocked", err)
	}
	s.mustRelease(t, h)
}

func (s *suite) withLockPanic(t *testing.T) {
	l := s.New(t)
	name := s.name(t, "x")
	func() {
		defer func() {
			if r := recover(); r != "boom" {
				t.Fatalf("recovered %v; want the panic of fn to continue", r)
			}
		}()
		lock.WithLock(ctxT(t), l, name, func(context.Context) error { panic("boom") })
	}()
	s.mustRelease(t, s.mustAcquire(t, s.New(t), name))
}

func (s *suite) names(t *testing.T) {
	l := s.New(t)
	for _, bad := range []string{"", "a\x00b", "\xff\xfe", strings.Repeat("n", lock.MaxNameLen+1)} {
		h, err := l.Acquire(ctxT(t), bad)
		if err == nil {
			h.Release()
			t.Errorf("Acquire(%.20q) succeeded; want ErrInvalidName", bad)
		} else if !errors.Is(err, lock.ErrInvalidName) {
			t.Errorf("Acquire(%.20q) = %v; want ErrInvalidName", bad, err)
		}
	}
	base := s.name(t, "")
	long := base + strings.Repeat("L", lock.MaxNameLen-len(base)-1)
	// Pairs of distinct names that must not interfere with each other.
	pairs := [][2]string{
		{base + "a", base + "a/b"},
		{base + "a/b", base + "a%2Fb"},
		{base + "x", base + "x.0"},
		{base + "x", base + "x.lock"},
		{base + "x", base + "x:fence"},
		{base + "x", base + "X"},
		{base + "x", "../../" + base + "x"},
		{base + "ünï/cødé ☃", base + "ünï/cødé"},
		{long + "1", long + "2"},
	}
	for _, p := range pairs {
		h1 := s.mustAcquire(t, l, p[0])
		h2, err := l.Acquire(ctxT(t), p[1])
		if err != nil {
			t.Errorf("holding %.40q, Acquire(%.40q) = %v; distinct names must not interfere", p[0], p[1], err)
		} else {
			s.mustBeLocked(t, s.New(t), p[1])
			s.mustRelease(t, h2)
		}
		s.mustBeLocked(t, s.New(t), p[0])
		s.mustRelease(t, h1)
	}
	if s.Semaphore {
		// A semaphore's permits must not collide with a name that looks
		// like one of its slots.
		sem := s.New(t, lock.WithMaxConcurrent(2))
		x := base + "sem"
		h1, h2 := s.mustAcquire(t, sem, x), s.mustAcquire(t, sem, x)
		for _, other := range []string{x + ".0", x + ".1", x + "/0", x + ":0", x + ".limit"} {
			s.mustRelease(t, s.mustAcquire(t, l, other))
		}
		s.mustRelease(t, h1)
		s.mustRelease(t, h2)
	}
}

func (s *suite) badOptions(t *testing.T) {
	for _, tc := range []struct {
		what string
		opt  lock.Option
	}{
		{"WithMaxConcurrent(0)", lock.WithMaxConcurrent(0)},
		{"WithMaxConcurrent(-1)", lock.WithMaxConcurrent(-1)},
		{"WithTTL(0)", lock.WithTTL(0)},
		{"WithTTL(-1s)", lock.WithTTL(-time.Second)},
		{"WithWaitTimeout(0)", lock.WithWaitTimeout(0)},
		{"WithMaxHold(0)", lock.WithMaxHold(0)},
		{"WithMaxHold(-1s)", lock.WithMaxHold(-time.Second)},
		// An option of another backend would be silently ignored.
		{"another backend's option", backend.Value("locktest-other", "WithX", foreignKey{}, 1)},
	} {
		h, err := s.New(t, tc.opt).Acquire(ctxT(t), s.name(t, "x"))
		if err == nil {
			h.Release()
			t.Errorf("Acquire with %s succeeded; want ErrInvalidOption", tc.what)
		} else if !errors.Is(err, lock.ErrInvalidOption) {
			t.Errorf("Acquire with %s = %v; want ErrInvalidOption", tc.what, err)
		} else if want := s.prefix() + lock.ErrInvalidOption.Error() + ": "; !strings.HasPrefix(err.Error(), want) {
			t.Errorf("Acquire with %s = %q; want the shape %q + detail", tc.what, err, want)
		}
	}
	_, err := s.New(t).Acquire(ctxT(t), "")
	if want := s.prefix() + lock.ErrInvalidName.Error(); !errors.Is(err, lock.ErrInvalidName) || !strings.HasPrefix(err.Error(), want) {
		t.Errorf(`Acquire("") = %v; want ErrInvalidName, said as %q + detail`, err, want)
	}
}

type foreignKey struct{}

// prefix is how the backend's errors begin, "<backend>: ", taken from
// its ErrLocked: every error reads "<backend>: <root sentinel>: detail".
func (s *suite) prefix() string {
	b, _, _ := strings.Cut(s.ErrLocked.Error(), ": ")
	return b + ": "
}

// waitQueued returns once n Acquires wait on name, as the Waiting hook
// counts them, failing if they do not within a generous bound. Without
// the hook it gives them a moment, which proves nothing.
func (s *suite) waitQueued(t testing.TB, name string, n int) {
	t.Helper()
	waitCounted(t, s.Waiting, name, n)
}

func waitCounted(t testing.TB, waiting func(string) int, name string, n int) {
	t.Helper()
	if waiting == nil {
		time.Sleep(50 * time.Millisecond)
		return
	}
	if !testenv.Poll(30*time.Second, func() bool { return waiting(name) >= n }) {
		t.Fatalf("%d Acquires waiting on %q after 30s, want %d", waiting(name), name, n)
	}
}

// wait: a waiting Acquire waits while the lock is held and gets it after
// the release. The waiter itself records whether the release had begun
// when it got the lock, so a waiter let in early is caught whenever it
// comes in.
func (s *suite) wait(t *testing.T) {
	if !s.Wait {
		t.Skip("backend does not claim WithWait")
	}
	name := s.name(t, "x")
	h := s.mustAcquire(t, s.New(t), name)
	var releasing atomic.Bool
	type result struct {
		h     lock.Holder
		err   error
		early bool // got the lock before Release was called
	}
	got := make(chan result, 1)
	w := s.New(t, lock.WithWait())
	ctx := ctxT(t)
	go func() {
		h, err := w.Acquire(ctx, name)
		got <- result{h, err, err == nil && !releasing.Load()}
	}()
	s.waitQueued(t, name, 1)
	releasing.Store(true)
	s.mustRelease(t, h)
	r := <-got
	if r.err != nil {
		t.Fatalf("waiting Acquire: %v", r.err)
	}
	defer s.mustRelease(t, r.h)
	if r.early {
		t.Fatal("a waiting Acquire got the lock while it was held, before its Release")
	}
	if r.h.Token() <= h.Token() {
		t.Fatalf("waiter's token %d not above the previous holder's %d", r.h.Token(), h.Token())
	}
}

// fifo: waiters of a mutex, each a client of its own, get it in the order
// they began to wait, one at a time, with rising tokens; the holder that
// releases and asks again at once queues behind them, it does not take
// the name back.
func (s *suite) fifo(t *testing.T) {
	if s.FIFO == nil {
		t.Skip("backend does not claim FIFO waiting")
	}
	queued := s.Queued
	if queued == nil {
		queued = s.Waiting
	}
	if queued == nil {
		t.Fatal("locktest: Backend.FIFO needs Queued or Waiting")
	}
	name := s.name(t, "x")
	ctx := ctxT(t)
	type turn struct {
		i   int
		h   lock.Holder
		err error
	}
	const n = 5
	turns := make(chan turn, n+1)
	wait := func(i int, l lock.Locker) {
		go func() {
			h, err := l.Acquire(ctx, name)
			turns <- turn{i, h, err}
		}()
	}
	holder := s.FIFO(t, lock.WithWait())
	h := s.mustAcquire(t, holder, name)
	for i := range n {
		wait(i, s.FIFO(t, lock.WithWait()))
		waitCounted(t, queued, name, i+1)
	}
	s.mustRelease(t, h)
	wait(n, holder) // the holder again, at once
	last := h.Token()
	for want := range n + 1 {
		var r turn
		select {
		case r = <-turns:
		case <-time.After(30 * time.Second):
			t.Fatalf("turn %d: no lock within 30s", want)
		}
		if r.err != nil {
			t.Fatalf("waiter %d: %v", r.i, r.err)
		}
		if r.i != want {
			r.h.Release()
			t.Fatalf("waiter %d got the lock in turn %d; want the waiters in the order they began to wait, then the holder that asked again (%d)", r.i, want, n)
		}
		if r.h.Token() <= last {
			t.Errorf("waiter %d: token %d not above the previous holder's %d", r.i, r.h.Token(), last)
		}
		last = r.h.Token()
		s.mustRelease(t, r.h)
	}
}

// outage: an Acquire on a backend that cannot be reached (a closed port)
// or that does not answer (a server that accepts and says nothing) fails
// with an error that does not match ErrLocked, waiting or not, and
// returns within its deadline plus backend.Grace, whatever the client's
// own timeouts. The bound checked is that plus a slack for a loaded
// machine, a guard, not a timing target; the times are logged.
func (s *suite) outage(t *testing.T) {
	if s.Dial == nil {
		t.Skip("backend has no Dial hook")
	}
	type call struct {
		what string
		d    time.Duration
		opts []lock.Option
	}
	calls := []call{{"no wait", 300 * time.Millisecond, nil}}
	if s.Wait {
		calls = append(calls, call{"WithWait", 300 * time.Millisecond, []lock.Option{lock.WithWait()}},
			call{"WithWaitTimeout", time.Hour, []lock.Option{lock.WithWait(), lock.WithWaitTimeout(300 * time.Millisecond)}},
			call{"WithWait, ctx already done", 0, []lock.Option{lock.WithWait()}})
	}
	for _, srv := range []struct{ what, addr string }{{"closed port", testenv.ClosedAddr(t)}, {"silent server", silentAddr(t)}} {
		t.Run(strings.ReplaceAll(srv.what, " ", ""), func(t *testing.T) {
			for _, c := range calls {
				s.outageCall(t, s.Dial(t, srv.addr, c.opts...), c.what, c.d)
			}
		})
	}
}

func (s *suite) outageCall(t *testing.T, l lock.Locker, what string, d time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	start := time.Now()
	h, err := l.Acquire(ctx, s.name(t, "x"))
	took := time.Since(start)
	if err == nil {
		h.Release()
		t.Errorf("%s: Acquire on a backend that cannot answer succeeded", what)
		return
	}
	if errors.Is(err, lock.ErrLocked) || errors.Is(err, s.ErrLocked) {
		t.Errorf("%s: Acquire on a backend that cannot answer = %v; it matches ErrLocked, as if the name were held", what, err)
	}
	if !strings.HasPrefix(err.Error(), s.prefix()) {
		t.Errorf("%s: %q; want it said as %q + what + detail", what, err, s.prefix())
	}
	if bound := min(d, 300*time.Millisecond) + backend.Grace + 2*time.Second; took > bound {
		t.Errorf("%s: Acquire with a deadline of %v returned after %v", what, d, took)
	}
	t.Logf("%s, deadline %v: %v after %v", what, d, err, took)
}

// silentAddr returns the address of a server that accepts connections,
// reads what it is sent, and never answers, until the test ends.
func silentAddr(t testing.TB) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			go io.Copy(io.Discard, c)
		}
	}()
	return l.Addr().String()
}

func (s *suite) waitTimeout(t *testing.T) {
	if !s.Wait {
		t.Skip("backend does not claim WithWait")
	}
	name := s.name(t, "x")
	h := s.mustAcquire(t, s.New(t), name)
	// A wait that runs out while queued, and one whose ctx has ended
	// before it began: both gave up waiting.
	for _, d := range []time.Duration{100 * time.Millisecond, 0} {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		w, err := s.New(t, lock.WithWait()).Acquire(ctx, name)
		cancel()
		if err == nil {
			w.Release()
			t.Fatal("a wait on a held lock succeeded")
		}
		for _, want := range []error{s.ErrLocked, lock.ErrLocked, context.DeadlineExceeded} {
			if !errors.Is(err, want) {
				t.Errorf("wait with a deadline of %v = %v; want it to match %v", d, err, want)
			}
		}
	}
	s.mustRelease(t, h)
	s.mustRelease(t, s.mustAcquire(t, s.New(t), name))
}

// withWaitTimeout: WithWaitTimeout bounds the wait and nothing else. A
// wait that runs out is a WaitError while the caller's context lives on;
// a lock it gets is held, and WithLock's work runs, past the bound.
func (s *suite) withWaitTimeout(t *testing.T) {
	if !s.Wait {
		t.Skip("backend does not claim WithWait")
	}
	const bound = 100 * time.Millisecond
	name := s.name(t, "x")
	ctx := ctxT(t)
	h := s.mustAcquire(t, s.New(t), name)
	w, err := s.New(t, lock.WithWaitTimeout(bound)).Acquire(ctx, name)
	if err == nil {
		w.Release()
		t.Fatal("a wait with WithWaitTimeout on a held lock succeeded")
	}
	for _, want := range []error{s.ErrLocked, lock.ErrLocked, context.DeadlineExceeded} {
		if !errors.Is(err, want) {
			t.Errorf("a wait that ran out = %v; want it to match %v", err, want)
		}
	}
	if ctx.Err() != nil {
		t.Fatal("the caller's context ended")
	}
	s.mustRelease(t, h)
	err = lock.WithLock(ctx, s.New(t, lock.WithWaitTimeout(bound)), name, func(ctx context.Context) error {
		select {
		case <-ctx.Done():
			return fmt.Errorf("the work's context ended: %w", context.Cause(ctx))
		case <-time.After(4 * bound):
			return nil
		}
	})
	if err != nil {
		t.Fatalf("WithLock with WithWaitTimeout(%v), work of %v: %v", bound, 4*bound, err)
	}
}

// waitCancelMany: waiters that give up must not keep or leak a permit.
func (s *suite) waitCancelMany(t *testing.T) {
	if !s.Wait {
		t.Skip("backend does not claim WithWait")
	}
	name := s.name(t, "x")
	h := s.mustAcquire(t, s.New(t), name)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	const waiters = 6
	for i := 0; i < waiters; i++ {
		l := s.New(t, lock.WithWait())
		wg.Add(1)
		go func() {
			defer wg.Done()
			if w, err := l.Acquire(ctx, name); err == nil {
				w.Release()
			}
		}()
	}
	s.waitQueued(t, name, waiters)
	// Cancel the waiters while the lock is being released: a permit
	// handed to a waiter that gave up must come back.
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := h.Release(); err != nil {
			t.Errorf("Release: %v", err)
		}
	}()
	cancel()
	wg.Wait()
	s.mustRelease(t, s.mustAcquire(t, s.New(t), name))
}

func (s *suite) semaphore(t *testing.T) {
	if !s.Semaphore {
		t.Skip("backend does not claim WithMaxConcurrent")
	}
	name := s.name(t, "x")
	l := s.New(t, lock.WithMaxConcurrent(3))
	var hs []lock.Holder
	tokens := map[uint64]bool{}
	for i := 0; i < 3; i++ {
		h := s.mustAcquire(t, l, name)
		if tokens[h.Token()] || h.Token() == 0 {
			t.Fatalf("permit %d has token %d, already handed out or zero", i, h.Token())
		}
		tokens[h.Token()] = true
		hs = append(hs, h)
	}
	s.mustBeLocked(t, s.New(t, lock.WithMaxConcurrent(3)), name)
	s.mustRelease(t, hs[1])
	h := s.mustAcquire(t, s.New(t, lock.WithMaxConcurrent(3)), name)
	if tokens[h.Token()] {
		t.Fatalf("a new permit reused token %d", h.Token())
	}
	s.mustRelease(t, h)
	s.mustRelease(t, hs[0])
	s.mustRelease(t, hs[2])
}

func (s *suite) semaphoreExclusion(t *testing.T) {
	if !s.Semaphore {
		t.Skip("backend does not claim WithMaxConcurrent")
	}
	s.hammer(t, s.name(t, "x"), 3, lock.WithMaxConcurrent(3))
}

func (s *suite) limitMismatch(t *testing.T) {
	if !s.Semaphore {
		t.Skip("backend does not claim WithMaxConcurrent")
	}
	name := s.name(t, "x")
	h := s.mustAcquire(t, s.New(t, lock.WithMaxConcurrent(3)), name)
	for _, n := range []int{1, 2, 4} {
		w, err := s.New(t, lock.WithMaxConcurrent(n)).Acquire(ctxT(t), name)
		if err == nil {
			w.Release()
			t.Errorf("holding %q with limit 3, Acquire with limit %d succeeded; want ErrLimitMismatch", name, n)
		} else if !errors.Is(err, lock.ErrLimitMismatch) {
			t.Errorf("holding with limit 3, Acquire with limit %d = %v; want ErrLimitMismatch", n, err)
		}
	}
	s.mustRelease(t, h)
}

func (s *suite) extend(t *testing.T) {
	if !s.Extend {
		t.Skip("backend does not claim Extend")
	}
	name := s.name(t, "x")
	h := s.mustAcquire(t, s.New(t), name)
	e, ok := h.(lock.Extender)
	if !ok {
		t.Fatalf("holder %T does not implement lock.Extender", h)
	}
	if err := e.Extend(ctxT(t)); err != nil {
		t.Fatalf("Extend of a held lock: %v", err)
	}
	s.mustRelease(t, h)
	if err := e.Extend(ctxT(t)); err == nil {
		t.Fatal("Extend after Release succeeded")
	}
}

func (s *suite) leaseExpiry(t *testing.T) {
	if s.TTL == 0 {
		t.Skip("backend does not claim a test TTL")
	}
	name := s.name(t, "x")
	l := s.New(t, lock.WithTTL(s.TTL), lock.WithAutoRenew(false))
	h := s.mustAcquire(t, l, name)
	bound := 10*s.TTL + 5*time.Second
	eventually(t, h.Done(), bound, "an unrenewed lease ending")
	if !errors.Is(h.Err(), s.ErrLockLost) || !errors.Is(h.Err(), lock.ErrLockLost) {
		t.Fatalf("Err after the lease ran out = %v; want ErrLockLost", h.Err())
	}
	// The holder may be told before the server frees the name (lease
	// backends stop a margin before the lease runs out).
	h2 := s.acquireWithin(t, name, s.LossBound)
	if h2.Token() <= h.Token() {
		t.Fatalf("successor token %d not above %d", h2.Token(), h.Token())
	}
	if err := h.Release(); !errors.Is(err, lock.ErrLockLost) {
		t.Fatalf("Release of an expired lock = %v; want ErrLockLost", err)
	}
	s.mustBeLocked(t, s.New(t), name) // the late Release freed nothing
	if s.Extend {
		if err := h.(lock.Extender).Extend(ctxT(t)); !errors.Is(err, lock.ErrLockLost) {
			t.Fatalf("Extend of an expired lock = %v; want ErrLockLost", err)
		}
		s.mustBeLocked(t, s.New(t), name)
	}
	s.mustRelease(t, h2)

	// By default the lease renews in the background (lock.WithAutoRenew):
	// the lock outlives several TTLs.
	h = s.mustAcquire(t, s.New(t, lock.WithTTL(s.TTL)), name)
	select {
	case <-h.Done():
		t.Fatalf("an auto-renewed lock was lost: %v", h.Err())
	case <-time.After(3 * s.TTL):
	}
	s.mustBeLocked(t, s.New(t), name)
	s.mustRelease(t, h)
}

func (s *suite) loss(t *testing.T) {
	if s.Lose == nil {
		t.Skip("backend gave no way to force a loss")
	}
	name := s.name(t, "x")
	l := s.New(t)
	var h lock.Holder
	acquired := make(chan struct{})
	err := lock.WithLock(ctxT(t), backendSpy(l, &h), name, func(ctx context.Context) error {
		close(acquired)
		s.Lose(t, h)
		select {
		case <-ctx.Done():
			if !errors.Is(context.Cause(ctx), lock.ErrLockLost) {
				t.Errorf("fn's context cause = %v; want ErrLockLost", context.Cause(ctx))
			}
			return ctx.Err()
		case <-time.After(s.LossBound):
			t.Errorf("fn's context not cancelled within %v of the loss", s.LossBound)
			return nil
		}
	})
	if !errors.Is(err, lock.ErrLockLost) || !errors.Is(err, s.ErrLockLost) {
		t.Fatalf("WithLock after a loss = %v; want an error matching ErrLockLost", err)
	}
	if !closed(h.Done()) || !errors.Is(h.Err(), lock.ErrLockLost) {
		t.Fatalf("after a loss: Done closed %v, Err %v", closed(h.Done()), h.Err())
	}
	// A loss the backend finds says why, for an observer's metrics.
	switch r := lock.ReasonOf(h.Err()); r {
	case lock.ReasonExpired, lock.ReasonSession, lock.ReasonRemoved:
	default:
		t.Errorf("lock.ReasonOf(%v) = %q; want the loss to wrap lock.ErrLeaseExpired, ErrSessionEnded or ErrRemoved", h.Err(), r)
	}
	// The name is free again, for another client, within the bound.
	h2 := s.acquireWithin(t, name, s.LossBound)
	if h2.Token() <= h.Token() {
		t.Errorf("token after a loss %d not above %d", h2.Token(), h.Token())
	}
	s.mustRelease(t, h2)
}

// acquireWithin acquires name with a new client, retrying on contention
// for up to bound.
func (s *suite) acquireWithin(t testing.TB, name string, bound time.Duration) lock.Holder {
	t.Helper()
	return takeWithin(t, func() lock.Locker { return s.New(t) }, name, bound)
}

// takeWithin acquires name with a locker from newLocker, retrying on
// contention for up to bound.
func takeWithin(t testing.TB, newLocker func() lock.Locker, name string, bound time.Duration) lock.Holder {
	t.Helper()
	var h lock.Holder
	var err error
	free := testenv.Poll(bound, func() bool {
		h, err = newLocker().Acquire(ctxT(t), name)
		return !errors.Is(err, lock.ErrLocked)
	})
	if !free || err != nil {
		t.Fatalf("name not free %v after its lock was lost or ended: %v", bound, err)
	}
	return h
}

// backendSpy returns a locker that records the holder it hands out.
func backendSpy(l lock.Locker, h *lock.Holder) lock.Locker {
	return lock.LockerFunc(func(ctx context.Context, name string) (lock.Holder, error) {
		got, err := l.Acquire(ctx, name)
		*h = got
		return got, err
	})
}

func (s *suite) inspect(t *testing.T) {
	if s.Inspector == nil {
		t.Skip("backend gave no Inspector")
	}
	in := s.Inspector(t)
	name := s.name(t, "x")
	info, err := in.Inspect(ctxT(t), name)
	if err != nil || len(info.Holders) != 0 {
		t.Fatalf("Inspect of a free name = %+v, %v; want no holders", info, err)
	}
	h := s.mustAcquire(t, s.New(t, lock.WithOwner("locktest-owner")), name)
	info, err = in.Inspect(ctxT(t), name)
	if err != nil {
		t.Fatal(err)
	}
	if len(info.Holders) != 1 || info.Holders[0].Token != h.Token() {
		t.Fatalf("Inspect of a held name = %+v; want one holder with token %d", info, h.Token())
	}
	if got := info.Holders[0].Owner; got != "locktest-owner" {
		t.Errorf("Inspect: Owner = %q; want the WithOwner value %q", got, "locktest-owner")
	}
	s.mustRelease(t, h)
	info, err = in.Inspect(ctxT(t), name)
	if err != nil || len(info.Holders) != 0 {
		t.Fatalf("Inspect after Release = %+v, %v; want no holders", info, err)
	}
	if _, err := in.Inspect(ctxT(t), ""); !errors.Is(err, lock.ErrInvalidName) {
		t.Fatalf("Inspect(\"\") = %v; want ErrInvalidName", err)
	}
}

// listed runs List(prefix) to its end and returns each name's sorted
// tokens, failing on an error or a name listed twice.
func listed(t *testing.T, ls lock.Lister, prefix string) map[string][]uint64 {
	t.Helper()
	got := map[string][]uint64{}
	for info, err := range ls.List(ctxT(t), prefix) {
		if err != nil {
			t.Fatalf("List(%q): %v", prefix, err)
		}
		if _, dup := got[info.Name]; dup {
			t.Fatalf("List(%q) yielded %q twice", prefix, info.Name)
		}
		// A hashed long name may be listed escaped (ListEscapesLongNames);
		// which form each backend gives is checked against want.
		escaped := strings.Contains(info.Name, "~") && strings.HasPrefix(info.Name, backend.EscapePrefix(prefix))
		if !strings.HasPrefix(info.Name, prefix) && !escaped {
			t.Errorf("List(%q) yielded %q", prefix, info.Name)
		}
		if len(info.Holders) > 0 && info.Limit < len(info.Holders) {
			t.Errorf("List: %q has Limit %d and %d holders", info.Name, info.Limit, len(info.Holders))
		}
		toks := []uint64{}
		for _, hi := range info.Holders {
			toks = append(toks, hi.Token)
		}
		slices.Sort(toks)
		got[info.Name] = toks
	}
	return got
}

// list: List(prefix) yields exactly the held names under prefix — one
// with a non-ASCII byte, a semaphore with two permits taken — each with
// its holders' tokens; released names disappear; names beside the
// prefix are not listed; breaking out of the loop ends it.
func (s *suite) list(t *testing.T) {
	if s.Lister == nil {
		t.Skip("backend gave no Lister")
	}
	ls := s.Lister(t)
	var opts []lock.Option
	if s.ListOwnedOnly {
		opts = append(opts, lock.WithOwner("locktest-owner"))
	}
	l := s.New(t, opts...)
	prefix := s.name(t, "in/")
	want := map[string][]uint64{}
	var held []lock.Holder
	hold := func(l lock.Locker, name string) lock.Holder {
		h := s.mustAcquire(t, l, name)
		held = append(held, h)
		listed := name
		if s.ListEscapesLongNames && strings.Contains(backend.Escape(name), "~") {
			listed = backend.Escape(name)
		}
		want[listed] = append(want[listed], h.Token())
		slices.Sort(want[listed])
		return h
	}
	defer func() {
		for _, h := range held {
			h.Release()
		}
	}()
	a := hold(l, prefix+"a")
	hold(l, prefix+"\u00fc/b")
	// Long enough that backend.Escape hashes it: its files or keys do
	// not carry the name.
	long := prefix + "long/" + strings.Repeat("\u00e9", 100)
	hold(l, long)
	if s.Semaphore {
		sem := s.New(t, append(opts, lock.WithMaxConcurrent(2))...)
		hold(sem, prefix+"sem")
		hold(sem, prefix+"sem")
		hold(s.New(t, append(opts, lock.WithMaxConcurrent(3))...), long+"sem")
	}
	beside := map[string][]uint64{}
	for _, name := range []string{s.name(t, "in"), s.name(t, "out/a")} {
		h := s.mustAcquire(t, l, name)
		held = append(held, h)
		beside[name] = []uint64{h.Token()}
	}
	if got := listed(t, ls, prefix); !reflect.DeepEqual(got, want) {
		t.Fatalf("List(%q) = %v; want %v", prefix, got, want)
	}
	all := maps.Clone(want)
	maps.Copy(all, beside)
	if got := listed(t, ls, s.name(t, "")); !reflect.DeepEqual(got, all) {
		t.Fatalf("List(%q) = %v; want %v", s.name(t, ""), got, all)
	}
	if got := listed(t, ls, s.name(t, "none/")); len(got) != 0 {
		t.Fatalf("List of a prefix nobody holds = %v; want nothing", got)
	}

	s.mustRelease(t, a)
	delete(want, prefix+"a")
	if got := listed(t, ls, prefix); !reflect.DeepEqual(got, want) {
		t.Fatalf("List(%q) after a Release = %v; want %v", prefix, got, want)
	}

	n := 0
	for _, err := range ls.List(ctxT(t), s.name(t, "")) {
		if err != nil {
			t.Fatal(err)
		}
		n++
		break // a Lister that yields again after this panics
	}
	if n != 1 {
		t.Fatalf("List yielded %d names before the break; want 1", n)
	}
}

// recorder is an Observer that keeps every event.
type recorder struct {
	mu     sync.Mutex
	events []lock.Event
}

func (r *recorder) Observe(_ context.Context, e lock.Event) {
	r.mu.Lock()
	r.events = append(r.events, e)
	r.mu.Unlock()
}

// wait returns the events once there are n, or what there is after d.
func (r *recorder) wait(n int, d time.Duration) []lock.Event {
	var got []lock.Event
	testenv.Poll(d, func() bool {
		r.mu.Lock()
		got = append([]lock.Event(nil), r.events...)
		r.mu.Unlock()
		return len(got) >= n
	})
	return got
}

// observer: each Acquire (taken or refused), Extend, Release and loss
// reports one event, of the right Op and Outcome, with the backend's
// name, the lock's name and the holder's token; releases and losses say
// how long the lock was held.
func (s *suite) observer(t *testing.T) {
	if s.Name == "" {
		t.Skip("backend gave no Name for its events")
	}
	rec := &recorder{}
	l := s.New(t, lock.WithObserver(rec))
	name := s.name(t, "x")
	type want struct {
		op  lock.Op
		out lock.Outcome
		tok uint64 // 0: not checked
	}
	var wants []want
	h := s.mustAcquire(t, l, name)
	wants = append(wants, want{lock.OpAcquire, lock.OutcomeOK, h.Token()})
	if w, err := l.Acquire(ctxT(t), name); err == nil {
		w.Release()
		t.Fatal("Acquire of a held lock succeeded")
	}
	wants = append(wants, want{lock.OpAcquire, lock.OutcomeLocked, 0})
	if e, ok := h.(lock.Extender); ok && s.Extend {
		if err := e.Extend(ctxT(t)); err != nil {
			t.Fatal(err)
		}
		wants = append(wants, want{lock.OpExtend, lock.OutcomeOK, h.Token()})
	}
	s.mustRelease(t, h)
	wants = append(wants, want{lock.OpRelease, lock.OutcomeOK, h.Token()})
	held := []int{len(wants) - 1}
	if s.Lose != nil {
		// Lost inside WithLock, whose renewal (where there is a lease)
		// notices the loss as an application would see it.
		var lost lock.Holder
		lock.WithLock(ctxT(t), backendSpy(l, &lost), name, func(ctx context.Context) error {
			s.Lose(t, lost)
			select {
			case <-ctx.Done():
			case <-time.After(s.LossBound):
			}
			return nil
		})
		if lost == nil {
			t.Fatal("WithLock did not acquire")
		}
		wants = append(wants, want{lock.OpAcquire, lock.OutcomeOK, lost.Token()}, want{lock.OpLost, lock.OutcomeLost, lost.Token()})
		held = append(held, len(wants)-1)
	}
	// A loss is reported just after Done closes; wait a moment more for
	// an extra event that should not come.
	got := rec.wait(len(wants), s.LossBound)
	got = append(got[:0:0], rec.wait(len(wants)+1, 50*time.Millisecond)...)
	if len(got) != len(wants) {
		t.Fatalf("%d events, want %d (%v): %+v", len(got), len(wants), wants, got)
	}
	for i, w := range wants {
		e := got[i]
		if e.Op != w.op || e.Outcome != w.out || e.Backend != s.Name || e.Name != name || (w.tok != 0 && e.Token != w.tok) {
			t.Errorf("event %d = %+v; want %s/%s of %q by %q, token %d", i, e, w.op, w.out, name, s.Name, w.tok)
		}
	}
	for _, i := range held {
		if got[i].Held <= 0 {
			t.Errorf("event %d (%s) has no held time: %+v", i, got[i].Op, got[i])
		}
	}
}

// close: closing a factory ends its holders (ErrLockLost and
// lock.ErrClosed), fails its waiting Acquires and later ones with
// lock.ErrClosed, frees its names for other clients, and a second Close
// is a no-op.
func (s *suite) close(t *testing.T) {
	if s.NewFactory == nil {
		t.Skip("backend gave no NewFactory")
	}
	f := s.NewFactory(t)
	l := f.AsLocker()
	name := s.name(t, "x")
	h := s.mustAcquire(t, l, name)
	errc := make(chan error, 1)
	if s.Wait {
		// The waiter is of the factory being closed, queued on its holder.
		w, ctx := f.AsLocker(lock.WithWait()), ctxT(t)
		go func() {
			h, err := w.Acquire(ctx, name)
			if err == nil {
				h.Release()
			}
			errc <- err
		}()
		waiting := s.Waiting
		if w, ok := f.(interface{ Waiting(string) int }); ok {
			waiting = w.Waiting
		}
		waitCounted(t, waiting, name, 1)
	}
	if err := f.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if s.Wait {
		select {
		case err := <-errc:
			if !errors.Is(err, lock.ErrClosed) {
				t.Errorf("a waiting Acquire after Close: %v; want an error matching lock.ErrClosed", err)
			}
		case <-time.After(s.LossBound):
			t.Errorf("a waiting Acquire still waits %v after Close", s.LossBound)
		}
	}
	eventually(t, h.Done(), s.LossBound, "a holder ending after Close")
	if err := h.Err(); !errors.Is(err, s.ErrLockLost) || !errors.Is(err, lock.ErrLockLost) || !errors.Is(err, lock.ErrClosed) {
		t.Errorf("holder after Close: Err = %v; want ErrLockLost and lock.ErrClosed", err)
	}
	if err := h.Release(); !errors.Is(err, lock.ErrLockLost) {
		t.Errorf("Release after Close = %v; want ErrLockLost", err)
	}
	if x, err := l.Acquire(ctxT(t), s.name(t, "later")); !errors.Is(err, lock.ErrClosed) {
		if err == nil {
			x.Release()
		}
		t.Errorf("Acquire after Close: %v; want an error matching lock.ErrClosed", err)
	}
	if err := f.Close(); err != nil {
		t.Errorf("second Close: %v; want nil", err)
	}
	s.mustRelease(t, s.acquireWithin(t, name, s.LossBound))
}

// leaks: after warm-up, a round of acquires, waits and releases leaves no
// goroutine behind. Per-factory machinery (a renewal loop, a watch) may
// linger while idle, but must stop within 5s of the last release.
func (s *suite) leaks(t *testing.T) {
	name := s.name(t, "x")
	l := s.New(t)
	cycle := func() {
		h := s.mustAcquire(t, l, name)
		if s.Wait {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
			if w, err := s.New(t, lock.WithWait()).Acquire(ctx, name); err == nil {
				w.Release()
			}
			cancel()
		}
		lock.WithLock(ctxT(t), l, name+"/w", func(context.Context) error { return nil })
		s.mustRelease(t, h)
	}
	cycle() // let backends start their per-factory machinery
	time.Sleep(50 * time.Millisecond)
	base := runtime.NumGoroutine()
	for i := 0; i < 10; i++ {
		cycle()
	}
	if !testenv.Poll(5*time.Second, func() bool { return runtime.NumGoroutine() <= base }) {
		buf := make([]byte, 1<<16)
		t.Fatalf("%d goroutines after release, %d before:\n%s", runtime.NumGoroutine(), base, buf[:runtime.Stack(buf, true)])
	}
}

// config: a factory's configuration error is seen at start-up (Err), with
// the family's shape, and is every Acquire's; a Locker from AsLocker tells
// the options its Acquires use (lock.Configured), so an adapter can
// refuse one that would misbehave under it.
func (s *suite) config(t *testing.T) {
	if s.NewFactory == nil {
		t.Skip("backend gave no NewFactory")
	}
	if err := s.NewFactory(t).Err(); err != nil {
		t.Fatalf("Err of a usable factory = %v", err)
	}
	bad := s.NewFactory(t, lock.WithMaxConcurrent(0))
	err := bad.Err()
	if want := s.prefix() + lock.ErrInvalidOption.Error(); !errors.Is(err, lock.ErrInvalidOption) || !strings.HasPrefix(fmt.Sprint(err), want) {
		t.Fatalf("Err of a factory with an invalid option = %v; want ErrInvalidOption, said as %q + detail", err, want)
	}
	if _, aerr := bad.AsLocker().Acquire(ctxT(t), s.name(t, "x")); !errors.Is(aerr, lock.ErrInvalidOption) {
		t.Fatalf("Acquire on a factory whose Err is %v = %v", err, aerr)
	}
	c, ok := s.NewFactory(t).AsLocker(lock.WithWait(), lock.WithOwner("o")).(lock.Configured)
	if !ok {
		t.Fatal("AsLocker's Locker is not a lock.Configured")
	}
	if o, err := c.Config(); err != nil || !o.Wait || o.Owner != "o" {
		t.Fatalf("Config() = %+v, %v; want Wait and Owner from AsLocker's options", o, err)
	}
	if _, err := s.NewFactory(t).AsLocker(lock.WithTTL(-1)).(lock.Configured).Config(); !errors.Is(err, lock.ErrInvalidOption) {
		t.Fatalf("Config() of AsLocker(WithTTL(-1)) = %v; want ErrInvalidOption", err)
	}
}

// tokensAfterCrash: a host crash may bring the token counter back with an
// older content, or a torn one; the next token is still above every token
// handed out before. Mutex, and semaphore where claimed.
func (s *suite) tokensAfterCrash(t *testing.T) {
	if s.TokenFile == nil {
		t.Skip("backend gave no TokenFile")
	}
	limits := []int{1}
	if s.Semaphore {
		limits = append(limits, 3)
	}
	for _, limit := range limits {
		name := s.name(t, fmt.Sprint(limit))
		l := s.New(t, lock.WithMaxConcurrent(limit))
		var last uint64
		next := func(what string) {
			t.Helper()
			h := s.mustAcquire(t, l, name)
			if h.Token() <= last {
				t.Fatalf("limit %d, %s: token %d after %d", limit, what, h.Token(), last)
			}
			last = h.Token()
			s.mustRelease(t, h)
		}
		next("first")
		file := s.TokenFile(name)
		old, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for range 5 {
			next("fresh")
		}
		for _, c := range []struct {
			what string
			data []byte
		}{{"after the file was reverted", old}, {"after a torn write", old[:len(old)/2]}, {"after a second revert", old}} {
			if err := os.WriteFile(file, c.data, 0o644); err != nil {
				t.Fatal(err)
			}
			next(c.what)
		}
	}
}
