package bench

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ubgo/lock/internal/testenv"
)

// Server work is counted by the server itself, not by the client: what a
// contended case costs the service per acquisition, whatever the library
// does on which connection. Every counter is server-wide (Redis, etcd) or
// database-wide (Postgres), so another client of the same server during a
// window inflates it; the contended cases run one at a time for that
// reason.

// work is what a service counted over one window.
type work struct {
	ops     float64 // Postgres transactions (one per statement outside a transaction block), Redis commands, etcd unary RPCs
	scripts float64 // Redis: EVAL, EVALSHA and FCALL (scripts and functions) among ops
	usec    float64 // Redis: µs spent in those scripts (their commandstats usec, the commands they call included)
	cpu     float64 // Redis: µs of the server process's CPU (INFO cpu: used_cpu_sys + used_cpu_user)
	writes  float64 // etcd: keys put and deleted
	watch   float64 // etcd: watch responses sent (what a release costs the watchers it wakes)
}

func (w work) sub(v work) work {
	return work{ops: w.ops - v.ops, scripts: w.scripts - v.scripts, usec: w.usec - v.usec, cpu: w.cpu - v.cpu, writes: w.writes - v.writes, watch: w.watch - v.watch}
}

// per is w divided by n operations.
func (w work) per(n float64) work {
	return work{ops: w.ops / n, scripts: w.scripts / n, usec: w.usec / n, cpu: w.cpu / n, writes: w.writes / n, watch: w.watch / n}
}

// counters reads the Redis and etcd counters. Postgres's is read by
// pgCount, on connections of its own.
type counters struct {
	e    *env
	http http.Client
}

func newCounters(e *env) *counters {
	return &counters{e: e, http: http.Client{Timeout: 5 * time.Second}}
}

// counts reports whether a round's work on service can be counted.
func (c *counters) counts(service string) bool {
	return c != nil && (service == Redis || service == Etcd) && c.e.available(service)
}

// read takes the counter of service before or after a window.
func (c *counters) read(ctx context.Context, service string) (work, error) {
	switch service {
	case Redis:
		return c.redisWork(ctx)
	case Etcd:
		return c.etcdWork(ctx)
	}
	return work{}, fmt.Errorf("no counter for %q", service)
}

// redisWork sums INFO commandstats and reads INFO cpu. INFO itself is
// left out: only the reading makes it. A script's usec includes the
// commands it calls, which commandstats also counts on their own.
func (c *counters) redisWork(ctx context.Context) (work, error) {
	info, err := c.e.rdb.Info(ctx, "commandstats").Result()
	if err != nil {
		return work{}, err
	}
	var w work
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		cmd, isCmd := strings.CutPrefix(name, "cmdstat_")
		if !ok || !isCmd || cmd == "info" {
			continue
		}
		n, err := statField(rest, "calls")
		if err != nil {
			return work{}, fmt.Errorf("INFO commandstats: %q: %w", line, err)
		}
		w.ops += n
		switch cmd {
		case "eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro":
			us, err := statField(rest, "usec")
			if err != nil {
				return work{}, fmt.Errorf("INFO commandstats: %q: %w", line, err)
			}
			w.scripts += n
			w.usec += us
		}
	}
	cpu, err := c.e.rdb.Info(ctx, "cpu").Result()
	if err != nil {
		return work{}, err
	}
	for _, f := range []string{"used_cpu_sys", "used_cpu_user"} {
		s, err := strconv.ParseFloat(field(cpu, f, nil), 64)
		if err != nil {
			return work{}, fmt.Errorf("INFO cpu: %s: %w", f, err)
		}
		w.cpu += s * 1e6
	}
	return w, nil
}

// statField reads key's number from a commandstats line's
// "calls=N,usec=N,..." part.
func statField(s, key string) (float64, error) {
	for _, kv := range strings.Split(s, ",") {
		if v, ok := strings.CutPrefix(kv, key+"="); ok {
			return strconv.ParseFloat(v, 64)
		}
	}
	return 0, fmt.Errorf("no %s", key)
}

// etcdWork reads etcd's /metrics on its client URL: the unary RPCs it
// handled (watches and lease keep-alives are streams and not in it), the
// keys it put and deleted, and the messages its Watch streams sent (one
// per watch response: an event batch, a creation, a cancellation, a
// progress notice), where a wake-all shows up as one per waiter.
func (c *counters) etcdWork(ctx context.Context) (work, error) {
	ep := testenv.EtcdEndpoints()[0]
	if !strings.Contains(ep, "://") {
		ep = "http://" + ep
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, ep+"/metrics", nil)
	if err != nil {
		return work{}, err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return work{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return work{}, fmt.Errorf("etcd /metrics: %s", resp.Status)
	}
	var w work
	seen := false
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		var into *float64
		switch {
		case strings.HasPrefix(line, "grpc_server_handled_total{") && strings.Contains(line, `grpc_type="unary"`):
			into, seen = &w.ops, true
		case strings.HasPrefix(line, "etcd_mvcc_put_total "), strings.HasPrefix(line, "etcd_mvcc_delete_total "):
			into = &w.writes
		case strings.HasPrefix(line, "grpc_server_msg_sent_total{") && strings.Contains(line, `grpc_service="etcdserverpb.Watch"`):
			into = &w.watch
		default:
			continue
		}
		f := strings.Fields(line)
		n, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			return work{}, fmt.Errorf("etcd /metrics: %q: %w", line, err)
		}
		*into += n
	}
	if err := sc.Err(); err != nil {
		return work{}, err
	}
	if !seen {
		return work{}, fmt.Errorf("etcd /metrics at %s has no grpc_server_handled_total", ep)
	}
	return w, nil
}

// benchApp is the application_name of the contended cases' Postgres
// connections (pglock's sessions, the floor's connections).
const benchApp = "ubgo-lock-bench"

// A pgBuild makes a Postgres case's contenders on pool, their sessions
// named app; defer_ takes what closes them.
type pgBuild func(ctx context.Context, pool *pgxpool.Pool, app string, defer_ func(func())) ([]contender, error)

// Postgres counts a backend's transactions (xact_commit: one per statement
// run outside a transaction block, as a lock's statements are) but
// publishes them late: a busy backend at most once a second, an idle one
// only when it next runs a statement, or when it exits. So the statements
// of a window are counted on connections that exist only for it:
//
//   - a pass opens a pool of its own (application_name unique to it),
//     builds the case's contenders on it, warms each up once, runs the
//     window, closes all of it, waits until none of its backends is left
//     in pg_stat_activity (a backend publishes its counts before it
//     leaves), and reads xact_commit before and after;
//   - a second pass does all of that without the window;
//
// and the window's statements are the difference. Every reading is one
// transaction on a connection of its own, in both passes alike.

// pgCounts runs pgCount for each Postgres mutex case, one after the
// other, once everything else of the contended section is closed.
func pgCounts(ctx context.Context, e *env, cases []*contCase, d time.Duration, logf func(string, ...any)) {
	var pg []*contCase
	most := 0
	for _, c := range cases {
		if c.service == Postgres && c.build != nil && c.err == nil && c.limit == 1 {
			pg, most = append(pg, c), max(most, c.n)
		}
	}
	if len(pg) == 0 {
		return
	}
	logf("postgres statements: %d cases, two passes each", len(pg))
	conns := e.pgConns(ctx, most+8)
	// The contended rounds' connections publish their counts as they
	// leave: wait for them first.
	if _, err := pgRead(ctx, benchApp); err != nil {
		for _, c := range pg {
			c.err = fmt.Errorf("counting statements: %w", err)
		}
		return
	}
	for _, c := range pg {
		if err := c.pgCount(ctx, conns, d); err != nil {
			c.err = fmt.Errorf("counting statements: %w", err)
		}
	}
}

// pgCount measures the statements of one window of c: see above.
func (c *contCase) pgCount(ctx context.Context, conns int32, d time.Duration) error {
	base, _, err := c.pgPass(ctx, conns, 0)
	if err != nil {
		return err
	}
	w, res, err := c.pgPass(ctx, conns, d)
	if err != nil {
		return err
	}
	res.work, res.counted = w.sub(base), true
	c.count = &res
	return nil
}

// pgPass is one pass of pgCount; d 0 runs no window.
func (c *contCase) pgPass(ctx context.Context, conns int32, d time.Duration) (work, contRes, error) {
	app := fmt.Sprintf("%s-count-%d", benchApp, time.Now().UnixNano())
	w0, err := pgRead(ctx, "")
	if err != nil {
		return work{}, contRes{}, err
	}
	var closers []func()
	closeAll := func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
		closers = nil
	}
	defer closeAll()
	pool, err := dialPostgresApp(ctx, conns, app)
	if err != nil {
		return work{}, contRes{}, err
	}
	closers = append(closers, pool.Close)
	cs, err := c.build(ctx, pool, app, func(fn func()) { closers = append(closers, fn) })
	if err != nil {
		return work{}, contRes{}, err
	}
	for _, ct := range cs {
		if err := ct.lock(ctx); err != nil {
			return work{}, contRes{}, err
		}
		if err := ct.unlock(); err != nil {
			return work{}, contRes{}, err
		}
	}
	var res contRes
	if d > 0 {
		if res, err = c.window(ctx, cs, d); err != nil {
			return work{}, contRes{}, err
		}
	}
	closeAll()
	w1, err := pgRead(ctx, app)
	if err != nil {
		return work{}, contRes{}, err
	}
	return w1.sub(w0), res, nil
}

// pgRead reads the database's xact_commit on a connection of its own,
// once no backend named gone (if not "") is left.
func pgRead(ctx context.Context, gone string) (work, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cfg, err := pgx.ParseConfig(testenv.PostgresDSN())
	if err != nil {
		return work{}, err
	}
	cfg.RuntimeParams["application_name"] = benchApp + "-reader"
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return work{}, err
	}
	defer conn.Close(context.Background())
	for {
		var left, n int64
		err := conn.QueryRow(ctx, `SELECT (SELECT count(*) FROM pg_stat_activity
				WHERE $1 <> '' AND pid <> pg_backend_pid() AND application_name LIKE $1 || '%'), xact_commit
			FROM pg_stat_database WHERE datname = current_database()`, pgx.QueryExecModeSimpleProtocol, gone).Scan(&left, &n)
		if err != nil {
			return work{}, err
		}
		if left == 0 {
			return work{ops: float64(n)}, nil
		}
		t := time.NewTimer(10 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return work{}, fmt.Errorf("%d backends of %s still there: %w", left, gone, ctx.Err())
		case <-t.C:
		}
	}
}
