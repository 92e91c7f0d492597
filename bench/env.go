package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/ubgo/lock/internal/testenv"
)

// Service names, as testenv.Unavailable and the report use them.
const (
	Redis    = "redis"
	Postgres = "postgres"
	Etcd     = "etcd"
)

// env is what every case runs against: the services (each may be missing)
// and a scratch directory.
type env struct {
	cfg    Config
	dir    string
	prefix string // key prefix no earlier run used

	rdb   *redis.Client
	pool  *pgxpool.Pool
	etcd  *clientv3.Client
	rts   map[string]*rtCounter // round trips made on rdb, pool and etcd, by service
	down  map[string]error      // services that could not be reached
	cc    map[int]*contClients  // by number of contenders
	close []func()
}

func (e *env) available(service string) bool { return e.down[service] == nil }

// defer_ runs fn when the benchmark ends, last registered first.
func (e *env) defer_(fn func()) { e.close = append(e.close, fn) }

func (e *env) shutdown() { e.closeFrom(0) }

// mark and closeFrom scope what one section set up: closeFrom(m) runs what
// was registered since mark returned m, so that the factories of one
// section do no background work while the next is measured.
func (e *env) mark() int { return len(e.close) }

func (e *env) closeFrom(m int) {
	for i := len(e.close) - 1; i >= m; i-- {
		e.close[i]()
	}
	e.close = e.close[:m]
}

func newEnv(ctx context.Context, cfg Config) (*env, error) {
	dir, err := os.MkdirTemp("", "ubgo-lock-bench-")
	if err != nil {
		return nil, err
	}
	e := &env{cfg: cfg, dir: dir, down: map[string]error{}, cc: map[int]*contClients{},
		rts:    map[string]*rtCounter{Redis: {}, Postgres: {}, Etcd: {}},
		prefix: fmt.Sprintf("ubgo-lock-bench/%d/", time.Now().UnixNano())}
	e.defer_(func() { os.RemoveAll(dir) })

	if cfg.Local {
		for _, s := range []string{Redis, Postgres, Etcd} {
			e.down[s] = errors.New("not dialled: Config.Local")
		}
		return e, nil
	}
	if e.rdb, err = dialRedis(ctx, e.rts[Redis]); err != nil {
		e.down[Redis] = err
	} else {
		e.defer_(func() { e.rdb.Close() })
	}
	if e.pool, err = dialPostgres(ctx, 0, e.rts[Postgres]); err != nil {
		e.down[Postgres] = err
	} else {
		e.defer_(e.pool.Close)
	}
	if e.etcd, err = dialEtcd(ctx, e.rts[Etcd].unary()); err != nil {
		e.down[Etcd] = err
	} else {
		e.defer_(func() { e.etcd.Close() })
	}
	return e, nil
}

// dialRedis connects to Redis; rts, if not nil, counts the round trips.
func dialRedis(ctx context.Context, rts *rtCounter) (*redis.Client, error) {
	o := &redis.Options{Addr: testenv.RedisAddr()}
	if rts != nil {
		var d net.Dialer
		o.Dialer = rts.dial(d.DialContext)
	}
	rdb := redis.NewClient(o)
	if err := testenv.Ping(ctx, func(ctx context.Context) error { return rdb.Ping(ctx).Err() }); err != nil {
		rdb.Close()
		return nil, err
	}
	return rdb, nil
}

// dialPostgres opens a pool; maxConns 0 keeps pgx's default; rts, if not
// nil, counts the round trips.
func dialPostgres(ctx context.Context, maxConns int32, rts *rtCounter) (*pgxpool.Pool, error) {
	return dialPostgresWith(ctx, maxConns, rts, "")
}

// dialPostgresApp opens a pool whose connections have application_name
// app, so that they can be found in pg_stat_activity.
func dialPostgresApp(ctx context.Context, maxConns int32, app string) (*pgxpool.Pool, error) {
	return dialPostgresWith(ctx, maxConns, nil, app)
}

func dialPostgresWith(ctx context.Context, maxConns int32, rts *rtCounter, app string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(testenv.PostgresDSN())
	if err != nil {
		return nil, err
	}
	if app != "" {
		cfg.ConnConfig.RuntimeParams["application_name"] = app
	}
	if rts != nil {
		cfg.ConnConfig.DialFunc = rts.dial(cfg.ConnConfig.DialFunc)
	}
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err == nil {
		err = testenv.Ping(ctx, pool.Ping)
	}
	if err != nil {
		if pool != nil {
			pool.Close()
		}
		return nil, err
	}
	return pool, nil
}

func dialEtcd(ctx context.Context, opts ...grpc.DialOption) (*clientv3.Client, error) {
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   testenv.EtcdEndpoints(),
		DialTimeout: 3 * time.Second,
		DialOptions: opts,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		return nil, err
	}
	if err := testenv.Ping(ctx, func(ctx context.Context) error {
		_, err := cli.Get(ctx, "ubgo-lock-bench-probe")
		return err
	}); err != nil {
		cli.Close()
		return nil, err
	}
	return cli, nil
}

// Machine describes where a run happened.
type Machine struct {
	CPUs     int
	CPU      string
	Kernel   string
	Go       string
	Services map[string]string // service → version, or why it was missing
	Load     [2]string         // 1-minute load average at the start and at the end of the run
	Date     time.Time
}

func (e *env) machine(ctx context.Context) Machine {
	m := Machine{CPUs: runtime.NumCPU(), Go: runtime.Version(), Services: map[string]string{}, Date: time.Now().UTC()}
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPU = strings.TrimSpace(v)
				break
			}
		}
		f.Close()
	}
	m.Load[0] = loadAvg()
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	for s, err := range e.down {
		m.Services[s] = "unavailable: " + err.Error()
	}
	if e.rdb != nil {
		info, err := e.rdb.Info(ctx, "server").Result()
		m.Services[Redis] = "Redis " + field(info, "redis_version", err)
	}
	if e.pool != nil {
		var v string
		err := e.pool.QueryRow(ctx, "SHOW server_version").Scan(&v)
		m.Services[Postgres] = "PostgreSQL " + field("v:"+v, "v", err)
	}
	if e.etcd != nil {
		v := "?"
		if eps := e.etcd.Endpoints(); len(eps) > 0 {
			if st, err := e.etcd.Status(ctx, eps[0]); err == nil {
				v = st.Version
			}
		}
		m.Services[Etcd] = "etcd " + v
	}
	return m
}

// loadAvg is the 1-minute load average: anything much above zero means
// something else ran on the machine during the run.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return "?"
	}
	return f[0]
}

// field finds "key:value" in Redis INFO-style text.
func field(text, key string, err error) string {
	if err != nil {
		return "? (" + err.Error() + ")"
	}
	for _, line := range strings.Split(text, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), key+":"); ok {
			return v
		}
	}
	return "?"
}
