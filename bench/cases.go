package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	bsm "github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	redsyncgoredis "github.com/go-redsync/redsync/v4/redis/goredis/v9"
	gofrs "github.com/gofrs/flock"
	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"golang.org/x/sys/unix"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/etcdlock"
	"github.com/ubgo/lock/filelock"
	"github.com/ubgo/lock/flock"
	"github.com/ubgo/lock/memlock"
	"github.com/ubgo/lock/pglock"
	"github.com/ubgo/lock/redislock"
)

// kind says what a case is to the report.
type kind int

const (
	floorKind kind = iota // the least the service or the kernel can do
	oursKind              // a backend of this family
	peerKind              // a library users would otherwise pick
)

func (k kind) String() string { return [...]string{"floor", "ours", "peer"}[k] }

// Case ids. Ratios are looked up by id.
const (
	idMutex      = "memory/sync.Mutex"
	idMemlock    = "memory/memlock"
	idFlockFloor = "file/open+flock+close"
	idFlockCtr   = "file/open+flock+pread+pwrite+close"
	idFlock      = "file/flock"
	idFilelock   = "file/filelock"
	idGofrs      = "file/gofrs-flock"
	idPing       = "redis/PING"
	idRedisFloor = "redis/SET NX PX + CAD"
	idRedislock  = "redis/redislock"
	idBsm        = "redis/bsm-redislock"
	idRedsync    = "redis/redsync"
	idSelect1    = "postgres/SELECT 1"
	idPgFloor    = "postgres/try_advisory_lock + unlock"
	idPglock     = "postgres/pglock"
	idPgBlocking = "postgres/pg_advisory_lock (blocking)"
	idPgShared   = "postgres/try_advisory_lock_shared + unlock_shared"
	idEtcdGet    = "etcd/Get"
	idEtcdPut    = "etcd/Put"
	idEtcdFloor  = "etcd/txn put-if-absent + delete"
	idEtcdlock   = "etcd/etcdlock"
	idEtcdMutex  = "etcd/concurrency.Mutex"
)

// opCase is one operation timed on its own: an uncontended acquire and
// release, or a floor.
type opCase struct {
	id      string
	service string // "" for cases that need no server
	label   string
	kind    kind
	floor   string // the raw lock this case is measured against
	rtt     string // one round trip of the same service
	inner   int    // operations per timed sample (for operations shorter than the clock's cost)
	op      func(ctx context.Context) error
	rts     *rtCounter // the service's round trips; nil for cases that need no server
	err     error
	res     [numConds][]roundRes
}

type roundRes struct {
	s       summary
	allocs  float64 // heap objects allocated per operation, by the whole process
	rts     float64 // round trips per operation
	work    work    // the server's work per operation (Redis only)
	counted bool    // work was counted
}

func failed(id, service, label string, k kind, err error) *opCase {
	return &opCase{id: id, service: service, label: label, kind: k, err: err}
}

// casesMemory: sync.Mutex is the floor of an in-process lock.
func casesMemory(e *env) []*opCase {
	var mu sync.Mutex
	f := memlock.NewFactory(memlock.WithLogger(nil))
	e.defer_(func() { f.Close() })
	return []*opCase{
		{id: idMutex, label: "sync.Mutex Lock+Unlock", kind: floorKind, inner: 1000, op: func(context.Context) error {
			mu.Lock()
			//lint:ignore SA2001 the empty critical section is the point: the floor of Lock+Unlock
			mu.Unlock()
			return nil
		}},
		{id: idMemlock, label: "memlock Acquire+Release", kind: oursKind, floor: idMutex, op: cycle(f.Acquire)},
		{id: idMemlock + " shared", label: "memlock Acquire(WithShared)+Release", kind: oursKind, floor: idMutex, op: cycle(f.Acquire, lock.WithShared())},
	}
}

// casesFile: open+flock+close is the floor of a lock on one host.
func casesFile(e *env) []*opCase {
	dir := filepath.Join(e.dir, "uncontended")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return []*opCase{failed(idFlockFloor, "", "open+flock+close", floorKind, err)}
	}
	floorPath := filepath.Join(dir, "floor.lock")
	ff := flock.NewFactory(flock.WithDir(filepath.Join(dir, "flock")), flock.WithLogger(nil))
	e.defer_(func() { ff.Close() })
	fl := filelock.NewFactory(filelock.WithDir(filepath.Join(dir, "filelock")), filelock.WithLogger(nil))
	e.defer_(func() { fl.Close() })
	g := gofrs.New(filepath.Join(dir, "gofrs.lock"))
	return []*opCase{
		{id: idFlockFloor, label: "open + flock(LOCK_EX|LOCK_NB) + close", kind: floorKind, op: func(context.Context) error {
			fd, err := unix.Open(floorPath, unix.O_RDWR|unix.O_CREAT|unix.O_CLOEXEC, 0o644)
			if err != nil {
				return err
			}
			defer unix.Close(fd)
			return unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB)
		}},
		{id: idFlockCtr, label: "the floor plus reading and writing a token counter in the file", kind: floorKind, op: func(context.Context) error {
			fd, err := unix.Open(floorPath, unix.O_RDWR|unix.O_CREAT|unix.O_CLOEXEC, 0o644)
			if err != nil {
				return err
			}
			defer unix.Close(fd)
			if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
				return err
			}
			var buf [64]byte
			if _, err := unix.Pread(fd, buf[:], 0); err != nil {
				return err
			}
			_, err = unix.Pwrite(fd, ctrRecord, 0)
			return err
		}},
		{id: idFlock, label: "flock Acquire+Release", kind: oursKind, floor: idFlockFloor, op: cycle(ff.Acquire)},
		{id: idFlock + " shared", label: "flock Acquire(WithShared)+Release", kind: oursKind, floor: idFlockFloor, op: cycle(ff.Acquire, lock.WithShared())},
		{id: idFilelock, label: "filelock Acquire+Release", kind: oursKind, floor: idFlockFloor, op: cycle(fl.Acquire)},
		{id: idFilelock + " shared", label: "filelock Acquire(WithShared)+Release", kind: oursKind, floor: idFlockFloor, op: cycle(fl.Acquire, lock.WithShared())},
		{id: idGofrs, label: "gofrs/flock TryLock+Unlock", kind: peerKind, floor: idFlockFloor, op: func(context.Context) error {
			ok, err := g.TryLock()
			if err == nil && !ok {
				err = errors.New("gofrs/flock: not locked")
			}
			if err != nil {
				return err
			}
			return g.Unlock()
		}},
	}
}

var ctrRecord = []byte("counter 1764480000000000001\n")

// redisFloorRelease is the compare-and-delete of the raw Redis lock.
var redisFloorRelease = redis.NewScript(`if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0`)

// casesRedis: PING is one round trip; SET NX PX plus a compare-and-delete
// script is the least a correct Redis lock can do (two round trips).
func casesRedis(ctx context.Context, e *env) []*opCase {
	if !e.available(Redis) {
		return nil
	}
	rdb := e.rdb
	ours := redislock.NewFactory(rdb, redislock.WithKeyPrefix(e.prefix), redislock.WithLogger(nil))
	e.defer_(func() { ours.Close() })
	b := bsm.New(rdb)
	rs := redsync.New(redsyncgoredis.NewPool(rdb))
	rm := rs.NewMutex(e.prefix+"redsync", redsync.WithExpiry(30*time.Second), redsync.WithTries(1))
	floorKey := e.prefix + "floor"
	bsmKey := e.prefix + "bsm"
	return []*opCase{
		{id: idPing, service: Redis, label: "PING (one round trip)", kind: floorKind, op: func(ctx context.Context) error {
			return rdb.Ping(ctx).Err()
		}},
		{id: idRedisFloor, service: Redis, label: "SET NX PX + compare-and-delete script", kind: floorKind, rtt: idPing, op: func(ctx context.Context) error {
			ok, err := rdb.SetNX(ctx, floorKey, "v", 30*time.Second).Result()
			if err == nil && !ok {
				err = errors.New("floor: SET NX found the key")
			}
			if err != nil {
				return err
			}
			return redisFloorRelease.Run(ctx, rdb, []string{floorKey}, "v").Err()
		}},
		{id: idRedislock, service: Redis, label: "redislock Acquire+Release", kind: oursKind, floor: idRedisFloor, rtt: idPing, op: cycle(ours.Acquire)},
		{id: idRedislock + " shared", service: Redis, label: "redislock Acquire(WithShared)+Release", kind: oursKind, floor: idRedisFloor, rtt: idPing, op: cycle(ours.Acquire, lock.WithShared())},
		{id: idBsm, service: Redis, label: "bsm/redislock Obtain+Release", kind: peerKind, floor: idRedisFloor, rtt: idPing, op: func(ctx context.Context) error {
			l, err := b.Obtain(ctx, bsmKey, 30*time.Second, nil)
			if err != nil {
				return err
			}
			return l.Release(ctx)
		}},
		{id: idRedsync, service: Redis, label: "redsync Lock+Unlock", kind: peerKind, floor: idRedisFloor, rtt: idPing, op: func(ctx context.Context) error {
			if err := rm.LockContext(ctx); err != nil {
				return err
			}
			ok, err := rm.UnlockContext(ctx)
			if err == nil && !ok {
				err = errors.New("redsync: unlock found no lock")
			}
			return err
		}},
	}
}

// casesPostgres: SELECT 1 is one round trip; pg_try_advisory_lock and
// pg_advisory_unlock on a connection held for the purpose is the least a
// session lock can do (two round trips).
func casesPostgres(ctx context.Context, e *env) []*opCase {
	if !e.available(Postgres) {
		return nil
	}
	pc, err := e.pool.Acquire(ctx)
	if err != nil {
		return []*opCase{failed(idSelect1, Postgres, "SELECT 1", floorKind, err)}
	}
	c := pc.Hijack()
	e.defer_(func() { c.Close(context.Background()) })
	ours := pglock.NewFactory(e.pool, pglock.WithLogger(nil), pglock.WithApplicationName("ubgo-lock-bench"),
		pglock.WithKeyPrefix(e.prefix))
	e.defer_(func() { ours.Close() })
	const key = int64(0x75626f2d62656e63) // arbitrary, outside pglock's keys
	return []*opCase{
		{id: idSelect1, service: Postgres, label: "SELECT 1 (one round trip)", kind: floorKind, op: func(ctx context.Context) error {
			var one int
			return c.QueryRow(ctx, "SELECT 1").Scan(&one)
		}},
		{id: idPgFloor, service: Postgres, label: "pg_try_advisory_lock + pg_advisory_unlock, held connection", kind: floorKind, rtt: idSelect1, op: func(ctx context.Context) error {
			var ok bool
			if err := c.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", pgx.QueryExecModeCacheStatement, key).Scan(&ok); err != nil || !ok {
				return fmt.Errorf("floor lock: %v %w", ok, err)
			}
			if err := c.QueryRow(ctx, "SELECT pg_advisory_unlock($1)", pgx.QueryExecModeCacheStatement, key).Scan(&ok); err != nil || !ok {
				return fmt.Errorf("floor unlock: %v %w", ok, err)
			}
			return nil
		}},
		{id: idPgShared, service: Postgres, label: "pg_try_advisory_lock_shared + pg_advisory_unlock_shared, held connection", kind: floorKind, rtt: idSelect1, op: func(ctx context.Context) error {
			var ok bool
			if err := c.QueryRow(ctx, "SELECT pg_try_advisory_lock_shared($1)", pgx.QueryExecModeCacheStatement, key).Scan(&ok); err != nil || !ok {
				return fmt.Errorf("floor shared lock: %v %w", ok, err)
			}
			if err := c.QueryRow(ctx, "SELECT pg_advisory_unlock_shared($1)", pgx.QueryExecModeCacheStatement, key).Scan(&ok); err != nil || !ok {
				return fmt.Errorf("floor shared unlock: %v %w", ok, err)
			}
			return nil
		}},
		{id: idPglock, service: Postgres, label: "pglock Acquire+Release", kind: oursKind, floor: idPgFloor, rtt: idSelect1, op: cycle(ours.Acquire)},
		{id: idPglock + " shared", service: Postgres, label: "pglock Acquire(WithShared)+Release", kind: oursKind, floor: idPgShared, rtt: idSelect1, op: cycle(ours.Acquire, lock.WithShared())},
	}
}

// casesEtcd: Get is one round trip (a linearizable read), Put one write;
// a put-if-absent transaction on a lease granted beforehand plus a delete
// is the least an etcd lock can do.
func casesEtcd(ctx context.Context, e *env) []*opCase {
	if !e.available(Etcd) {
		return nil
	}
	cli := e.etcd
	lease, err := cli.Grant(ctx, 60)
	if err != nil {
		return []*opCase{failed(idEtcdFloor, Etcd, "txn put-if-absent + delete", floorKind, err)}
	}
	e.defer_(func() { cli.Revoke(context.Background(), lease.ID) })
	ours := etcdlock.NewFactory(cli, etcdlock.WithKeyPrefix(e.prefix+"etcdlock/"), etcdlock.WithLogger(nil))
	e.defer_(func() { ours.Close() })
	sess, err := concurrency.NewSession(cli, concurrency.WithTTL(60))
	if err != nil {
		return []*opCase{failed(idEtcdMutex, Etcd, "concurrency.Mutex", peerKind, err)}
	}
	e.defer_(func() { sess.Close() })
	m := concurrency.NewMutex(sess, e.prefix+"mutex")
	floorKey, getKey, putKey := e.prefix+"floor", e.prefix+"get", e.prefix+"put"
	return []*opCase{
		{id: idEtcdGet, service: Etcd, label: "Get (one round trip)", kind: floorKind, op: func(ctx context.Context) error {
			_, err := cli.Get(ctx, getKey)
			return err
		}},
		{id: idEtcdPut, service: Etcd, label: "Put (one write)", kind: floorKind, op: func(ctx context.Context) error {
			_, err := cli.Put(ctx, putKey, "v")
			return err
		}},
		{id: idEtcdFloor, service: Etcd, label: "txn put-if-absent on a lease + delete", kind: floorKind, rtt: idEtcdPut, op: func(ctx context.Context) error {
			resp, err := cli.Txn(ctx).
				If(clientv3.Compare(clientv3.CreateRevision(floorKey), "=", 0)).
				Then(clientv3.OpPut(floorKey, "v", clientv3.WithLease(lease.ID))).
				Commit()
			if err == nil && !resp.Succeeded {
				err = errors.New("floor: key exists")
			}
			if err != nil {
				return err
			}
			_, err = cli.Delete(ctx, floorKey)
			return err
		}},
		{id: idEtcdlock, service: Etcd, label: "etcdlock Acquire+Release", kind: oursKind, floor: idEtcdFloor, rtt: idEtcdPut, op: cycle(ours.Acquire)},
		{id: idEtcdlock + " shared", service: Etcd, label: "etcdlock Acquire(WithShared)+Release", kind: oursKind, floor: idEtcdFloor, rtt: idEtcdPut, op: cycle(ours.Acquire, lock.WithShared())},
		{id: idEtcdMutex, service: Etcd, label: "concurrency.Mutex Lock+Unlock (session made beforehand)", kind: peerKind, floor: idEtcdFloor, rtt: idEtcdPut, op: func(ctx context.Context) error {
			if err := m.Lock(ctx); err != nil {
				return err
			}
			return m.Unlock(ctx)
		}},
	}
}

// cycle is one Acquire+Release of the name "bench" with opts.
func cycle[H interface{ Release() error }](acquire func(context.Context, string, ...lock.Option) (H, error), opts ...lock.Option) func(context.Context) error {
	return func(ctx context.Context) error {
		h, err := acquire(ctx, "bench", opts...)
		if err != nil {
			return err
		}
		return h.Release()
	}
}
