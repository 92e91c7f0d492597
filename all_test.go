package lock_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ubgo/lock"
)

// setLocker is a mutexLocker that records the order of its acquires and
// refuses the names in busy.
type setLocker struct {
	*mutexLocker
	order []string
	busy  map[string]bool
}

func newSetLocker(busy ...string) *setLocker {
	l := &setLocker{mutexLocker: &mutexLocker{held: map[string]bool{}, tokens: map[string]uint64{}}, busy: map[string]bool{}}
	for _, b := range busy {
		l.busy[b] = true
	}
	return l
}

func (l *setLocker) Acquire(ctx context.Context, name string) (lock.Holder, error) {
	l.order = append(l.order, name)
	if l.busy[name] {
		return nil, lock.ErrLocked
	}
	return l.mutexLocker.Acquire(ctx, name)
}

func TestAcquireAllOrderAndMembers(t *testing.T) {
	l := newSetLocker()
	m, err := lock.AcquireAll(context.Background(), l, "c", "a", "b", "a")
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"a", "b", "c"}; !slices.Equal(l.order, want) {
		t.Fatalf("acquired in order %q; want %q (sorted, duplicates collapsed)", l.order, want)
	}
	for _, name := range []string{"a", "b", "c"} {
		if h := m.Member(name); h == nil || h.Token() == 0 || !l.held[name] {
			t.Fatalf("Member(%q) = %v, held %v", name, h, l.held[name])
		}
	}
	if m.Member("d") != nil {
		t.Fatal("Member of a name not in the set is not nil")
	}
	if m.Token() != 0 {
		t.Fatalf("Token of a set of three names = %d; want 0, which every fence refuses", m.Token())
	}
	one, err := lock.AcquireAll(context.Background(), newSetLocker(), "x")
	if err != nil || one.Token() == 0 || one.Token() != one.Member("x").Token() {
		t.Fatalf("Token of a set of one name = %v, %v; want the name's", one, err)
	}
	if err := m.Release(); err != nil {
		t.Fatal(err)
	}
	if len(l.held) != 0 {
		t.Fatalf("held after Release: %v", l.held)
	}
	select {
	case <-m.Done():
	default:
		t.Fatal("Done not closed after Release")
	}
	if m.Err() != nil || m.Release() != nil {
		t.Fatalf("after a clean Release: Err %v", m.Err())
	}
}

func TestAcquireAllAllOrNothing(t *testing.T) {
	l := newSetLocker("b")
	m, err := lock.AcquireAll(context.Background(), l, "c", "b", "a")
	if err == nil {
		m.Release()
		t.Fatal("AcquireAll with a held member succeeded")
	}
	if !errors.Is(err, lock.ErrLocked) || !strings.Contains(err.Error(), `"b"`) {
		t.Fatalf("err = %v; want ErrLocked naming b", err)
	}
	if len(l.held) != 0 {
		t.Fatalf("held after a failed AcquireAll: %v", l.held)
	}
	if !slices.Equal(l.order, []string{"a", "b"}) {
		t.Fatalf("acquired %q; want to stop at the first failure", l.order)
	}
	for _, bad := range [][]string{nil, {"a", ""}} {
		if _, err := lock.AcquireAll(context.Background(), l, bad...); !errors.Is(err, lock.ErrInvalidName) {
			t.Errorf("AcquireAll(%q) = %v; want ErrInvalidName", bad, err)
		}
	}
}

func TestAcquireAllMemberLoss(t *testing.T) {
	stubs := map[string]*stub{"a": newStub(), "b": newStub()}
	l := lock.LockerFunc(func(_ context.Context, name string) (lock.Holder, error) { return stubs[name], nil })
	m, err := lock.AcquireAll(context.Background(), l, "a", "b")
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := lock.KeepAlive(context.Background(), m, time.Hour)
	defer stop()
	stubs["b"].state.Lose(errToyLost)
	<-m.Done()
	<-ctx.Done()
	for _, err := range []error{m.Err(), context.Cause(ctx)} {
		if !errors.Is(err, lock.ErrLockLost) || !errors.Is(err, errToyLost) || !strings.Contains(err.Error(), `"b"`) {
			t.Fatalf("err = %v; want the loss of b", err)
		}
	}
	m.Release()
	if stubs["a"].released != 1 || stubs["b"].released != 1 {
		t.Fatal("Release after a loss did not release every member")
	}
	// A member released behind the set's back ends it too.
	stubs = map[string]*stub{"a": newStub(), "b": newStub()}
	m, _ = lock.AcquireAll(context.Background(), l, "a", "b")
	m.Member("a").Release()
	<-m.Done()
	if !errors.Is(m.Err(), lock.ErrLockLost) {
		t.Fatalf("err = %v; want ErrLockLost", m.Err())
	}
}

// A member lost while AcquireAll waits for a later name ends the wait, and
// one lost by the time the last name is taken fails the call too: a set is
// never returned with a member already gone.
func TestAcquireAllMemberLostDuringWait(t *testing.T) {
	for _, c := range []struct {
		what string
		b    func(ctx context.Context, a *stub) (lock.Holder, error)
	}{
		{"while b is awaited", func(ctx context.Context, a *stub) (lock.Holder, error) {
			a.state.Lose(errToyLost)
			<-ctx.Done() // the wait for b ends only by ctx
			return nil, lock.NewWaitError(lock.ErrLocked, ctx)
		}},
		{"before b is returned", func(_ context.Context, a *stub) (lock.Holder, error) {
			a.state.Lose(errToyLost)
			return newStub(), nil
		}},
	} {
		t.Run(c.what, func(t *testing.T) {
			a := newStub()
			var b lock.Holder
			l := lock.LockerFunc(func(ctx context.Context, name string) (lock.Holder, error) {
				if name == "a" {
					return a, nil
				}
				h, err := c.b(ctx, a)
				b = h
				return h, err
			})
			// Long enough never to run out here: only a's loss ends the wait.
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			m, err := lock.AcquireAll(ctx, l, "a", "b")
			if m != nil || !errors.Is(err, lock.ErrLockLost) || !errors.Is(err, errToyLost) || !strings.Contains(err.Error(), `member "a"`) {
				t.Fatalf("AcquireAll = %v, %v; want no set and the loss of a", m, err)
			}
			if errors.Is(err, lock.ErrLocked) {
				t.Fatalf("err = %v matches ErrLocked: nobody else held b", err)
			}
			if a.released != 1 || b != nil && b.(*stub).released != 1 {
				t.Fatal("the members taken were not released")
			}
		})
	}
}

func TestWithMaxHoldOption(t *testing.T) {
	o, err := lock.Apply(lock.Options{}, lock.WithMaxHold(time.Minute))
	if err != nil || o.MaxHold != time.Minute {
		t.Fatalf("%+v %v", o, err)
	}
	for _, d := range []time.Duration{0, -time.Second} {
		if _, err := lock.Apply(lock.Options{}, lock.WithMaxHold(d)); !errors.Is(err, lock.ErrInvalidOption) {
			t.Errorf("WithMaxHold(%v) = %v; want ErrInvalidOption", d, err)
		}
	}
	if !errors.Is(lock.ErrMaxHold, lock.ErrLockLost) || lock.OutcomeOf(lock.ErrMaxHold) != lock.OutcomeLost {
		t.Fatal("ErrMaxHold is not a loss")
	}
}
