//go:build linux

package chaos

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/etcdlock"
	"github.com/ubgo/lock/internal/testenv"
	"github.com/ubgo/lock/pglock"
	"github.com/ubgo/lock/redislock"
)

// mx is one backend's part of the matrix: a private server that faults
// may kill or stop (never the shared ones other tests use), the fault
// proxy in front of it, and how to make and inspect clients.
type mx struct {
	t       *testing.T
	name    string
	srv     *server
	addr    string // the server's: A, C and the checks connect straight to it
	p       *proxy // B's way to the server
	cleanup time.Duration
	ttl     string // lock run's --ttl ("" for pglock)
	bin     *mxBin
	seq     int
	insp    *mxFactory // a client of its own, for Inspect
	admin   *pgxpool.Pool
	rdb     *redis.Client
	// factory makes a client of the backend on addr; b: B's, with the
	// client library's default settings, and app naming its sessions.
	factory func(addr, app string, b bool) (*mxFactory, error)
	url     func(addr, app string) string
}

// mxFactory is one client's factory.
type mxFactory struct {
	as    func(opts ...lock.Option) lock.Locker
	in    lock.Inspector
	close func()
}

// The options of the matrix's factories: short leases and intervals, so
// that what a caller left behind is gone within seconds. WithOwner makes
// pglock send the name with its acquire, which is how the proxy knows
// the acquiring request.
const (
	mxRedisTTL   = time.Second
	mxEtcdTTL    = 2 * time.Second
	mxPgHealth   = 200 * time.Millisecond
	mxPgStmt     = time.Second
	mxPgPoll     = 200 * time.Millisecond
	mxOwner      = "chaos-matrix"
	mxEtcdExpiry = 500 * time.Millisecond // etcd's own lease expiry check
)

func startMatrix(t *testing.T, name string, bin *mxBin) *mx {
	m := &mx{t: t, name: name, bin: bin}
	var err error
	switch name {
	case "pglock":
		err = m.startPg()
	case "redislock":
		err = m.startRedis()
	case "etcdlock":
		err = m.startEtcd()
	}
	if err != nil {
		testenv.Unavailable(t, name+"'s private server", err)
	}
	m.p = startProxy(t, m.addr)
	if m.insp, err = m.factory(m.addr, "chaos-inspect", false); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.insp.close)
	return m
}

func pgDSN(addr, app string) string {
	return "postgres://postgres@" + addr + "/postgres?sslmode=disable&application_name=" + app
}

// startPg: pglock's clean-up bound is a session's: a statement that gets
// no answer closes its session within WithStatementTimeout, and Postgres
// frees its locks; a waiter notices within the poll or health interval.
func (m *mx) startPg() (err error) {
	m.cleanup = mxPgHealth + mxPgStmt + mxPgPoll
	if m.srv, m.addr, err = startPostgresServer(m.t); err != nil {
		return err
	}
	if m.admin, err = pgxpool.New(context.Background(), pgDSN(m.addr, "chaos-admin")); err != nil {
		return err
	}
	m.t.Cleanup(m.admin.Close)
	m.url = pgDSN
	m.factory = func(addr, app string, _ bool) (*mxFactory, error) {
		pool, err := pgxpool.New(context.Background(), pgDSN(addr, app))
		if err != nil {
			return nil, err
		}
		f := pglock.NewFactory(pool, pglock.WithHealthInterval(mxPgHealth), pglock.WithStatementTimeout(mxPgStmt),
			pglock.WithPollInterval(mxPgPoll), pglock.WithOwner(mxOwner), pglock.WithLogger(nil))
		return &mxFactory{as: f.AsLocker, in: f, close: func() { f.Close(); pool.Close() }}, nil
	}
	return nil
}

// startRedis: redislock's clean-up bound is two waiter TTLs (a writer's
// placeholder; a stray grant or queue line goes with one).
func (m *mx) startRedis() (err error) {
	m.cleanup, m.ttl = 2*mxRedisTTL, mxRedisTTL.String()
	if m.srv, m.addr, err = startRedisServer(m.t, m.t.TempDir()); err != nil {
		return err
	}
	m.rdb = redis.NewClient(&redis.Options{Addr: m.addr})
	m.t.Cleanup(func() { m.rdb.Close() })
	m.url = func(addr, _ string) string { return "redis://" + addr + "/0" }
	m.factory = func(addr, _ string, _ bool) (*mxFactory, error) {
		rdb := redis.NewClient(&redis.Options{Addr: addr}) // go-redis's defaults
		f := redislock.NewFactory(rdb, redislock.WithTTL(mxRedisTTL), redislock.WithOwner(mxOwner), redislock.WithLogger(nil))
		return &mxFactory{as: f.AsLocker, in: f, close: func() { f.Close(); rdb.Close() }}, nil
	}
	return nil
}

// startEtcd: etcdlock's clean-up bound is a lease: its TTL and etcd's
// expiry check.
func (m *mx) startEtcd() (err error) {
	m.cleanup, m.ttl = mxEtcdTTL+mxEtcdExpiry, mxEtcdTTL.String()
	if m.srv, m.addr, err = startEtcdServer(m.t, m.t.TempDir()); err != nil {
		return err
	}
	m.url = func(addr, _ string) string { return "etcd://" + addr }
	m.factory = func(addr, _ string, b bool) (*mxFactory, error) {
		cfg := clientv3.Config{Endpoints: []string{addr}, Logger: zap.NewNop()}
		if !b { // the others reconnect quickly once the server is back
			cfg.DialOptions = []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
				Backoff:           backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.2, MaxDelay: 200 * time.Millisecond},
				MinConnectTimeout: time.Second,
			})}
		}
		cli, err := clientv3.New(cfg)
		if err != nil {
			return nil, err
		}
		f := etcdlock.NewFactory(cli, etcdlock.WithTTL(mxEtcdTTL), etcdlock.WithOwner(mxOwner), etcdlock.WithLogger(nil))
		return &mxFactory{as: f.AsLocker, in: f, close: func() { f.Close(); cli.Close() }}, nil
	}
	return nil
}

// waiting reports whether B (its sessions named app, on pglock) is seen
// waiting for name: queued in the store (Inspect's Waiting), or where the
// store keeps no queue, subscribed to the name's releases (redislock's
// semaphores and readers) or blocked or listening (pglock).
func (m *mx) waiting(kind, name, app string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	switch {
	case m.name == "pglock":
		var n int
		err := m.admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity a
			WHERE (a.application_name = $1 OR a.application_name LIKE $1 || '/%') AND (a.query ILIKE 'LISTEN%' OR EXISTS (
				SELECT 1 FROM pg_locks l WHERE l.pid = a.pid AND l.locktype = 'advisory' AND NOT l.granted))`, app).Scan(&n)
		return err == nil && n > 0
	case m.name == "redislock" && (kind == "shared" || kind == "semaphore"):
		n, err := m.rdb.PubSubNumSub(ctx, redislock.DefaultKeyPrefix+"{"+name+"}:released").Result()
		return err == nil && n[redislock.DefaultKeyPrefix+"{"+name+"}:released"] > 0
	}
	info, err := m.insp.in.Inspect(ctx, name)
	return err == nil && info.Waiting > 0
}

// left says what the store still has of names (holders, queued waiters;
// on pglock any waiting advisory lock of the server), "" if nothing.
func (m *mx) left(names []string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	for _, name := range names {
		info, err := m.insp.in.Inspect(ctx, name)
		switch {
		case err != nil:
			return fmt.Sprintf("inspect %s: %v", name, err)
		case len(info.Holders) > 0 || info.Waiting > 0:
			return fmt.Sprintf("%s: %d holders, %d waiting", name, len(info.Holders), info.Waiting)
		}
	}
	if m.admin != nil {
		var n int
		if err := m.admin.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted`).Scan(&n); err != nil {
			return "pg_locks: " + err.Error()
		} else if n > 0 {
			return fmt.Sprintf("%d advisory locks waited for in pg_locks", n)
		}
	}
	return ""
}

// granted reports whether Inspect sees name held.
func (m *mx) granted(name string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	info, err := m.insp.in.Inspect(ctx, name)
	return err == nil && len(info.Holders) > 0
}

// inject starts fault f at once.
func (m *mx) inject(f string) error {
	switch f {
	case "kill":
		m.srv.kill()
	case "stop":
		return m.srv.pause()
	case "blackhole":
		m.p.hold()
	case "reset":
		m.p.refuseAll()
	}
	return nil
}

// heal ends fault f: the proxy lets everything through, a stopped server
// continues, a killed one starts again on its data.
func (m *mx) heal(f string) error {
	m.p.heal()
	m.srv.resume()
	m.srv.mu.Lock()
	down := m.srv.cmd == nil
	m.srv.mu.Unlock()
	if down {
		return m.srv.start()
	}
	return nil
}

// armTrip arms fault f for B's acquiring request, the first that carries
// marker. stop freezes the server as the request is sent; blackhole lets
// the request through and nothing after it; kill and reset hold the
// replies, wait until the server has granted name (Inspect; an HTTP/2
// server sends other frames before its reply) or, where Inspect cannot
// tell before a commit, a reply has waited 300ms, then kill the server
// or reset every connection, so that the reply never arrives. struck is
// closed once the fault struck, done once nothing more will strike;
// quit stops the wait for a request that never came.
func (m *mx) armTrip(f, marker, name string, quit <-chan struct{}) (struck, done <-chan struct{}) {
	closed := make(chan struct{})
	close(closed)
	switch f {
	case "stop":
		return m.p.arm(marker, func() {
			if err := m.srv.pause(); err != nil {
				m.t.Log(err)
			}
		}), closed
	case "blackhole":
		return m.p.arm(marker, m.p.hold), closed
	}
	var held <-chan struct{}
	sprung := m.p.arm(marker, func() { held = m.p.holdReplies() })
	st, dn := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(dn)
		select {
		case <-sprung:
		case <-quit:
			return
		}
		var heldAt time.Time
		quitting := false
		testenv.Poll(5*time.Second, func() bool {
			select {
			case <-quit:
				quitting = true
				return true
			case <-held:
				if heldAt.IsZero() {
					heldAt = time.Now()
				}
			default:
			}
			return m.granted(name) || !heldAt.IsZero() && time.Since(heldAt) > 300*time.Millisecond
		})
		if quitting {
			return
		}
		if f == "kill" {
			m.srv.kill()
			m.p.drop()
		} else {
			m.p.refuseAll()
		}
		close(st)
	}()
	return st, dn
}

// mxBin is the lock command, built once per TestFaultMatrix into dir.
type mxBin struct {
	dir  string
	once sync.Once
	path string
	err  error
}

func (b *mxBin) get() (string, error) {
	b.once.Do(func() {
		b.path = filepath.Join(b.dir, "lock")
		out, err := exec.Command("go", "build", "-o", b.path, "github.com/ubgo/lock/cmd/lock").CombinedOutput()
		if err != nil {
			b.err = fmt.Errorf("go build cmd/lock: %v: %s", err, out)
		}
	})
	return b.path, b.err
}
