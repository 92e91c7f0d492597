package pglock

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/ubgo/lock"
	"github.com/ubgo/lock/backend"
	"github.com/ubgo/lock/internal/testenv"
)

func testPool(t *testing.T) *pgxpool.Pool {
	pool, err := pgxpool.New(context.Background(), testenv.PostgresDSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	testenv.Need(t, "postgres", pool.Ping)
	return pool
}

// The Go key and the SQL function operators use agree.
func TestKeyMatchesSQL(t *testing.T) {
	pool := testPool(t)
	f := NewFactory(pool, WithLogger(nil))
	defer f.Close()
	h, err := f.Acquire(context.Background(), "setup") // creates pglock_key
	if err != nil {
		t.Fatal(err)
	}
	h.Release()
	for _, c := range []struct {
		kind, prefix, name string
		slot               int
	}{
		{kindMutex, "", "a", -1}, {kindMutex, "p", "a", -1}, {kindSlot, "", "x", 0}, {kindSlot, "", "x", 12},
		{kindWaiters, "tenant:7", "ünï/cødé ☃", -1}, {kindSemMark, "", "x.0", -1}, {kindLimit, "", "a/b", -1},
	} {
		var got int64
		var slot *int32
		if c.slot >= 0 {
			s := int32(c.slot)
			slot = &s
		}
		if err := pool.QueryRow(context.Background(), "SELECT public.pglock_key($1, $2, $3, $4)", c.kind, c.prefix, c.name, slot).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if want := advisoryKey(c.kind, c.prefix, c.name, c.slot); got != want {
			t.Errorf("pglock_key%v = %d, Go %d", c, got, want)
		}
	}
}

// A lock session that answers from another backend (as behind a
// transaction-mode pooler the first Acquire's check missed) is treated as
// lost, and the factory refuses every later Acquire.
func TestBackendChangeIsLoss(t *testing.T) {
	pool := testPool(t)
	f := NewFactory(pool, WithSessions(1), WithLogger(nil), WithHealthInterval(time.Hour))
	defer f.Close()
	ctx := context.Background()
	h, err := f.Acquire(ctx, t.Name())
	if err != nil {
		t.Fatal(err)
	}
	s := f.sessions[0]
	s.sem <- struct{}{}
	s.pid++ // what the session would see if a pooler switched backends
	<-s.sem
	if _, err := f.Acquire(ctx, t.Name()+"/2"); !errors.Is(err, ErrSessionChanged) {
		t.Fatalf("Acquire on a switched session = %v; want ErrSessionChanged", err)
	}
	<-h.Done()
	if !errors.Is(h.Err(), ErrLockLost) || !errors.Is(h.Err(), ErrSessionChanged) {
		t.Fatalf("holder Err = %v", h.Err())
	}
	// The next call is refused too, without a session.
	if _, err := f.Acquire(ctx, t.Name()); !errors.Is(err, ErrSessionChanged) {
		t.Fatalf("Acquire after the switch = %v; want ErrSessionChanged", err)
	}
	if n := f.open.Load(); n != 0 {
		t.Fatalf("%d lock sessions open after the refusal", n)
	}
}

// A factory nobody closes gives its lock sessions up once they are unused.
func TestIdleSessionsClose(t *testing.T) {
	pool := testPool(t)
	f := NewFactory(pool, WithLogger(nil), WithHealthInterval(50*time.Millisecond))
	defer f.Close()
	f.set.idleClose = 200 * time.Millisecond
	ctx := context.Background()
	h, err := f.Acquire(ctx, t.Name())
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	if h.Err() != nil || f.open.Load() != 1 {
		t.Fatalf("a session with a holder was closed: %v, %d open", h.Err(), f.open.Load())
	}
	h.Release()
	// The health tick that closes the idle session stops the checks once
	// it has checked every session: a moment after the count drops.
	stopped := func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.health == nil
	}
	if !testenv.Poll(10*time.Second, func() bool { return f.open.Load() == 0 && stopped() }) {
		t.Fatalf("after 10 s: %d sessions open, health checks stopped: %v", f.open.Load(), stopped())
	}
	// And it opens again on demand.
	h, err = f.Acquire(ctx, t.Name())
	if err != nil {
		t.Fatal(err)
	}
	h.Release()
}

// After a waiting acquire, a factory nobody closes gives up the connection
// it waited on (the listener's, or a wait session's) too, once nothing
// waits: with its sessions closed as idle, it keeps no connection at all.
func TestIdleListenerCloses(t *testing.T) {
	for _, ws := range []int{0, DefaultWaitSessions} {
		t.Run(fmt.Sprint("wait-sessions-", ws), func(t *testing.T) { idleAfterWait(t, ws) })
	}
}

func idleAfterWait(t *testing.T, ws int) {
	pool := testPool(t)
	app := fmt.Sprintf("pglock-idle-listener-%d", time.Now().UnixNano())
	f := NewFactory(pool, WithLogger(nil), WithHealthInterval(50*time.Millisecond), WithApplicationName(app), WithWaitSessions(ws))
	defer f.Close()
	f.set.idleClose = 200 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	h, err := f.Acquire(ctx, t.Name())
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		w, err := f.Acquire(ctx, t.Name(), WithWait())
		if err == nil {
			err = w.Release()
		}
		got <- err
	}()
	testenv.Eventually(t, 30*time.Second, "the Acquire waiting", func() bool { return f.Waiting(t.Name()) > 0 })
	h.Release()
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	conns := func() int {
		var n int
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", app).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	n := 0
	if !testenv.Poll(30*time.Second, func() bool { n = conns(); return n == 0 }) {
		var last string
		pool.QueryRow(ctx, "SELECT string_agg(query, ' | ') FROM pg_stat_activity WHERE application_name = $1", app).Scan(&last)
		t.Fatalf("%d connections of an idle factory still open 30s after its last wait (last queries: %s)", n, last)
	}
}

// A factory given no options uses the exported defaults, and WithSessions
// accepts up to MaxSessions.
func TestDefaults(t *testing.T) {
	f := NewFactory(nil)
	defer f.Close()
	want := settings{
		schema: DefaultSchema, sessions: DefaultSessions, waitSessions: DefaultWaitSessions, health: DefaultHealthInterval,
		stmtTimeout: DefaultStatementTimeout, poll: DefaultPollInterval,
		connectTimeout: DefaultConnectTimeout, appName: "pglock", idleClose: f.set.idleClose,
	}
	if f.set != want || len(f.sessions) != DefaultSessions || len(f.waits.all) != DefaultWaitSessions {
		t.Errorf("config without options = %+v (%d sessions, %d wait sessions), want %+v", f.set, len(f.sessions), len(f.waits.all), want)
	}
	for n, ok := range map[int]bool{0: true, MaxSessions: true, -1: false, MaxSessions + 1: false} {
		if _, err := lock.Apply(backend.Options(backendName), WithWaitSessions(n)); (err == nil) != ok {
			t.Errorf("WithWaitSessions(%d): option error %v", n, err)
		}
	}
	for n, ok := range map[int]bool{MaxSessions: true, MaxSessions + 1: false} {
		if _, err := lock.Apply(backend.Options(backendName), WithSessions(n)); (err == nil) != ok {
			t.Errorf("WithSessions(%d): option error %v", n, err)
		}
	}
}
