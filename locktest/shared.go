package locktest

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/internal/testenv"
)

// shared runs the checks of lock.WithShared: on a backend that claims
// Shared, the shared mode's rules; on one that does not, that it refuses
// WithShared instead of taking an exclusive lock.
func (s *suite) shared(t *testing.T) {
	t.Run("Options", s.sharedOptions)
	t.Run("Concurrent", s.sharedConcurrent)
	t.Run("Tokens", s.sharedTokens)
	t.Run("WriterPreference", s.sharedWriterPreference)
	t.Run("HandOff", s.sharedHandOff)
	t.Run("ReaderStream", s.sharedReaderStream)
	t.Run("Exclusion", s.sharedExclusion)
	t.Run("Kinds", s.sharedKinds)
}

// mustBeInvalid fails t unless acquiring name through l is refused with
// ErrInvalidOption, said as "<backend>: lock: invalid option: ...".
func (s *suite) mustBeInvalid(t *testing.T, what string, l lock.Locker, name string) {
	t.Helper()
	h, err := l.Acquire(ctxT(t), name)
	if err == nil {
		h.Release()
		t.Errorf("Acquire with %s succeeded; want ErrInvalidOption", what)
	} else if want := s.prefix() + lock.ErrInvalidOption.Error() + ": "; !errors.Is(err, lock.ErrInvalidOption) || !strings.HasPrefix(err.Error(), want) {
		t.Errorf("Acquire with %s = %v; want ErrInvalidOption, said as %q + detail", what, err, want)
	}
}

// sharedOptions: a name is shared or a semaphore, never both; a backend
// without a shared mode refuses WithShared rather than lock exclusively.
func (s *suite) sharedOptions(t *testing.T) {
	name := s.name(t, "x")
	if !s.Shared {
		s.mustBeInvalid(t, "WithShared on a backend that does not claim it", s.New(t, lock.WithShared()), name)
		return
	}
	s.mustBeInvalid(t, "WithShared and WithMaxConcurrent(2)", s.New(t, lock.WithShared(), lock.WithMaxConcurrent(2)), name)
	s.mustBeInvalid(t, "WithMaxConcurrent(2) and WithShared", s.New(t, lock.WithMaxConcurrent(2), lock.WithShared()), name)
	s.mustRelease(t, s.mustAcquire(t, s.New(t, lock.WithShared(), lock.WithMaxConcurrent(1)), name))
}

func (s *suite) skipUnshared(t *testing.T, wait bool) {
	t.Helper()
	if !s.Shared {
		t.Skip("backend does not claim WithShared")
	}
	if wait && !s.Wait {
		t.Skip("backend does not claim WithWait")
	}
}

// sharedConcurrent: shared holders from several clients hold the name at
// once, without waiting; an exclusive Acquire fails with ErrLocked while
// any holds, and a shared one while an exclusive holder holds.
func (s *suite) sharedConcurrent(t *testing.T) {
	s.skipUnshared(t, false)
	name := s.name(t, "x")
	var hs []lock.Holder
	tokens := map[uint64]bool{}
	for i := range 4 {
		h := s.mustAcquire(t, s.New(t, lock.WithShared()), name)
		if h.Token() == 0 || tokens[h.Token()] {
			t.Fatalf("shared holder %d has token %d: zero or already handed out", i, h.Token())
		}
		tokens[h.Token()] = true
		hs = append(hs, h)
	}
	s.mustBeLocked(t, s.New(t), name)
	for _, h := range hs[:3] {
		s.mustRelease(t, h)
	}
	s.mustBeLocked(t, s.New(t), name) // one shared holder is enough to keep a writer out
	s.mustRelease(t, hs[3])
	x := s.mustAcquire(t, s.New(t), name)
	s.mustBeLocked(t, s.New(t, lock.WithShared()), name)
	s.mustBeLocked(t, s.New(t), name)
	s.mustRelease(t, x)
	s.mustRelease(t, s.mustAcquire(t, s.New(t, lock.WithShared()), name))
}

// sharedTokens: a shared holder's token is above every exclusive holder's
// before it, an exclusive holder's above every shared holder's before it.
func (s *suite) sharedTokens(t *testing.T) {
	s.skipUnshared(t, false)
	name := s.name(t, "x")
	x1 := s.mustAcquire(t, s.New(t), name)
	s.mustRelease(t, x1)
	r1 := s.mustAcquire(t, s.New(t, lock.WithShared()), name)
	r2 := s.mustAcquire(t, s.New(t, lock.WithShared()), name)
	if r1.Token() <= x1.Token() || r2.Token() <= x1.Token() || r1.Token() == r2.Token() {
		t.Fatalf("shared tokens %d, %d after an exclusive holder's %d: want both above it, and distinct", r1.Token(), r2.Token(), x1.Token())
	}
	s.mustRelease(t, r1)
	s.mustRelease(t, r2)
	x2 := s.mustAcquire(t, s.New(t), name)
	if x2.Token() <= max(r1.Token(), r2.Token()) {
		t.Fatalf("exclusive token %d after shared holders' %d and %d: want above both", x2.Token(), r1.Token(), r2.Token())
	}
	s.mustRelease(t, x2)
	r3 := s.mustAcquire(t, s.New(t, lock.WithShared()), name)
	if r3.Token() <= x2.Token() {
		t.Fatalf("shared token %d after an exclusive holder's %d", r3.Token(), x2.Token())
	}
	s.mustRelease(t, r3)
}

// got is what a waiting Acquire returns, and whether the event it had to
// wait for had happened when it got the lock.
type got struct {
	h     lock.Holder
	err   error
	after bool
}

// waitFor starts a waiting Acquire of name through l; its result records
// whether flag was set when the lock was granted.
func waitFor(ctx context.Context, l lock.Locker, name string, flag *atomic.Bool) <-chan got {
	c := make(chan got, 1)
	go func() {
		h, err := l.Acquire(ctx, name)
		c <- got{h, err, flag.Load()}
	}()
	return c
}

// sharedWriterPreference: while a writer waits for a name held shared, a
// new reader does not get in: without WithWait it fails with ErrLocked,
// with WithWait it waits behind the writer. Reader to writer to reader.
func (s *suite) sharedWriterPreference(t *testing.T) {
	s.skipUnshared(t, true)
	name := s.name(t, "x")
	ctx := ctxT(t)
	r1 := s.mustAcquire(t, s.New(t, lock.WithShared()), name)
	var r1Released, wReleased atomic.Bool
	wc := waitFor(ctx, s.New(t, lock.WithWait()), name, &r1Released)
	s.waitQueued(t, name, 1)
	s.turnedAway(t, name)
	rc := waitFor(ctx, s.New(t, lock.WithShared(), lock.WithWait()), name, &wReleased)
	s.waitQueued(t, name, 2)
	r1Released.Store(true)
	s.mustRelease(t, r1)
	w := <-wc
	if w.err != nil {
		t.Fatalf("waiting writer: %v", w.err)
	}
	if !w.after {
		t.Error("a writer got the lock while a reader held it")
	}
	if w.h.Token() <= r1.Token() {
		t.Errorf("writer's token %d not above the reader's %d", w.h.Token(), r1.Token())
	}
	wReleased.Store(true)
	s.mustRelease(t, w.h)
	r := <-rc
	if r.err != nil {
		t.Fatalf("reader waiting behind the writer: %v", r.err)
	}
	if !r.after {
		t.Error("a reader that came while a writer waited got the lock before that writer released it")
	}
	if r.h.Token() <= w.h.Token() {
		t.Errorf("reader's token %d not above the writer's %d", r.h.Token(), w.h.Token())
	}
	s.mustRelease(t, r.h)
}

// turnedAway returns once a new reader's Acquire without WithWait fails
// with ErrLocked, as it must while a writer waits. The Waiting hook may
// count a writer a moment before its wait is in force in the store (a
// statement on its way), so a reader let in is released and the check
// repeated; a backend without writer preference lets every one in.
func (s *suite) turnedAway(t *testing.T, name string) {
	t.Helper()
	l := s.New(t, lock.WithShared())
	n := 0
	refused := testenv.Poll(10*time.Second, func() bool {
		h, err := l.Acquire(ctxT(t), name)
		switch {
		case errors.Is(err, s.ErrLocked) && errors.Is(err, lock.ErrLocked):
			return true
		case err != nil:
			t.Fatalf("a new reader while a writer waits: %v; want ErrLocked", err)
		}
		n++
		s.mustRelease(t, h)
		return false
	})
	if !refused {
		t.Fatalf("a new reader got the lock %d times in 10s while a writer waited; want ErrLocked (writer preference)", n)
	}
}

// sharedHandOff: readers waiting for a writer all get the lock when it
// releases, and hold it together.
func (s *suite) sharedHandOff(t *testing.T) {
	s.skipUnshared(t, true)
	name := s.name(t, "x")
	ctx := ctxT(t)
	x := s.mustAcquire(t, s.New(t), name)
	var released atomic.Bool
	const n = 3
	cs := make([]<-chan got, n)
	for i := range cs {
		cs[i] = waitFor(ctx, s.New(t, lock.WithShared(), lock.WithWait()), name, &released)
	}
	s.waitQueued(t, name, n)
	released.Store(true)
	s.mustRelease(t, x)
	var hs []lock.Holder
	for i, c := range cs {
		r := <-c
		if r.err != nil {
			t.Fatalf("waiting reader %d: %v", i, r.err)
		}
		hs = append(hs, r.h)
		if !r.after {
			t.Errorf("reader %d got the lock while the writer held it", i)
		}
		if r.h.Token() <= x.Token() {
			t.Errorf("reader %d's token %d not above the writer's %d", i, r.h.Token(), x.Token())
		}
	}
	// All n hold at once: none has released.
	for i, h := range hs {
		if closed(h.Done()) || h.Err() != nil {
			t.Errorf("reader %d: Done closed or Err %v while the readers hold together", i, h.Err())
		}
	}
	s.mustBeLocked(t, s.New(t), name)
	for _, h := range hs {
		s.mustRelease(t, h)
	}
}

// sharedReaderStream: a writer gets a name that a stream of readers keeps
// held without a gap — each reader releases only once another has come
// in after it, or once a reader was turned away (ErrLocked: the writer
// preference at work) — and no reader is inside while it holds. Without
// writer preference no reader is turned away, and the writer never gets
// in.
func (s *suite) sharedReaderStream(t *testing.T) {
	s.skipUnshared(t, true)
	name := s.name(t, "x")
	ctx := ctxT(t)
	stop := make(chan struct{})
	var readers, writers, entries, violations atomic.Int32
	var turnedAway atomic.Bool
	first := make(chan struct{})
	var once sync.Once
	var wg sync.WaitGroup
	errc := make(chan error, 4)
	for range 4 {
		l := s.New(t, lock.WithShared())
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				h, err := l.Acquire(ctx, name)
				if errors.Is(err, lock.ErrLocked) {
					turnedAway.Store(true)
					time.Sleep(time.Millisecond)
					continue
				}
				if err != nil {
					errc <- fmt.Errorf("reader: %w", err)
					return
				}
				readers.Add(1)
				if writers.Load() > 0 {
					violations.Add(1)
				}
				me := entries.Add(1)
				once.Do(func() { close(first) })
				for entries.Load() == me && !turnedAway.Load() && !closed(stop) {
					time.Sleep(100 * time.Microsecond) // until the next reader is in
				}
				readers.Add(-1)
				if err := h.Release(); err != nil {
					errc <- fmt.Errorf("reader's Release: %w", err)
					return
				}
			}
		})
	}
	<-first
	type result struct {
		h   lock.Holder
		err error
	}
	wc := make(chan result, 1)
	go func() {
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		h, err := s.New(t, lock.WithWait()).Acquire(wctx, name)
		if err == nil {
			writers.Add(1)
			if readers.Load() > 0 {
				violations.Add(1)
			}
			runtime.Gosched()
			time.Sleep(time.Millisecond)
			writers.Add(-1)
		}
		wc <- result{h, err}
	}()
	w := <-wc
	close(stop)
	if w.err == nil {
		s.mustRelease(t, w.h)
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Error(err)
	}
	if w.err != nil {
		t.Fatalf("a writer waiting behind a stream of readers (%d reads): %v", entries.Load(), w.err)
	}
	if n := violations.Load(); n > 0 {
		t.Fatalf("%d times a reader and the writer held the name at once", n)
	}
}

// sharedExclusion: readers and writers hammering one name. Never a
// writer beside anyone; a writer's token is above every token entered
// before it, a reader's above every writer's before it.
func (s *suite) sharedExclusion(t *testing.T) {
	s.skipUnshared(t, false)
	name := s.name(t, "x")
	ctx := ctxT(t)
	var readers, writers atomic.Int32
	var mu sync.Mutex
	var maxToken, maxWriter uint64
	var errs []string
	fail := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		if len(errs) < 10 {
			errs = append(errs, fmt.Sprintf(format, args...))
		}
	}
	var wg sync.WaitGroup
	errc := make(chan error, s.Workers)
	for w := range s.Workers {
		writer := w%3 == 0
		opts := []lock.Option{}
		if !writer {
			opts = append(opts, lock.WithShared())
		}
		if s.Wait {
			opts = append(opts, lock.WithWait())
		}
		l := s.New(t, opts...)
		wg.Go(func() {
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
				tok := h.Token()
				if writer {
					if n, rd := writers.Add(1), readers.Load(); n > 1 || rd > 0 {
						fail("a writer inside with %d writers and %d readers", n, rd)
					}
				} else if readers.Add(1); writers.Load() > 0 {
					fail("a reader inside beside a writer")
				}
				mu.Lock()
				if writer && tok <= maxToken {
					errs = append(errs, fmt.Sprintf("writer's token %d not above %d, entered before it", tok, maxToken))
				}
				if !writer && tok <= maxWriter {
					errs = append(errs, fmt.Sprintf("reader's token %d not above a writer's %d before it", tok, maxWriter))
				}
				maxToken = max(maxToken, tok)
				if writer {
					maxWriter = tok
				}
				mu.Unlock()
				runtime.Gosched()
				time.Sleep(100 * time.Microsecond)
				if writer {
					writers.Add(-1)
				} else {
					readers.Add(-1)
				}
				if err := h.Release(); err != nil {
					errc <- err
					return
				}
				r++
			}
		})
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Error(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(errs) > 0 {
		t.Fatalf("shared exclusion violated:\n%s", strings.Join(errs, "\n"))
	}
}

// sharedKinds: a name held one way — a mutex, shared, a semaphore — and
// asked for another way by a second client, in every order. Between a
// mutex and readers that is contention (ErrLocked); a semaphore beside
// either is a limit that disagrees (ErrLimitMismatch), whichever came
// first. The refused asker leaves nothing behind: once the holder
// releases, it gets the name.
func (s *suite) sharedKinds(t *testing.T) {
	type kind struct {
		name    string
		claimed bool
		opts    []lock.Option
	}
	kinds := []kind{
		{"Mutex", true, nil},
		{"Shared", s.Shared, []lock.Option{lock.WithShared()}},
		{"Semaphore", s.Semaphore, []lock.Option{lock.WithMaxConcurrent(3)}},
	}
	for _, held := range kinds {
		for _, asker := range kinds {
			if held.name == asker.name {
				continue
			}
			t.Run(held.name+"Then"+asker.name, func(t *testing.T) {
				if !held.claimed || !asker.claimed {
					t.Skip("backend does not claim both kinds")
				}
				name := s.name(t, "x")
				h := s.mustAcquire(t, s.New(t, held.opts...), name)
				l := s.New(t, asker.opts...)
				if held.name != "Semaphore" && asker.name != "Semaphore" {
					s.mustBeLocked(t, l, name)
				} else if w, err := l.Acquire(ctxT(t), name); err == nil {
					w.Release()
					t.Fatalf("holding %q as %s, Acquire as %s succeeded; want ErrLimitMismatch", name, held.name, asker.name)
				} else if !errors.Is(err, lock.ErrLimitMismatch) || errors.Is(err, lock.ErrLocked) {
					t.Fatalf("holding %q as %s, Acquire as %s = %v; want ErrLimitMismatch, not ErrLocked", name, held.name, asker.name, err)
				}
				s.mustRelease(t, h)
				s.mustRelease(t, s.mustAcquire(t, l, name))
			})
		}
	}
}
