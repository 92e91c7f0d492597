// Command 07-fencing-gc-pause is use case 7: process A holds the export
// lock, pauses (a long GC, a VM migration) past its lease, B takes the
// lock and uploads, and then A wakes up and uploads its stale export. The
// stale upload must be refused, and B's kept.
//
// No lock can stop A: while paused it cannot notice anything, and it
// resumes past its last check. The resource refuses it instead. Each holder
// has a fencing token (Holder.Token) strictly larger than every earlier
// holder's of the same name; every upload carries it, and the store accepts
// a token only if it is at least the highest it has accepted for that key
// (lock.Fence's rule: RejectIfStale returns lock.ErrStaleToken for a lower
// one). The check and the write must be one atomic step, or A could pass
// the check, pause, and write after B. Each store here does it with the
// backend's durable Fence, in the same service as the locks:
//
//   - filelock (the default, no infrastructure): filelock.Fence.Apply holds
//     the key's fence record (a flock) while the write runs, for every
//     process on the host;
//   - redis (the scenario's backend): redislock.Fence.Apply compares and
//     records the token and writes the data in one script;
//   - etcd: etcdlock.Fence.Apply puts the data in the Txn that compares and
//     records the token.
//
// The locks are taken with a bare Acquire without renewal, so A's lease
// runs out while it is paused; B waits for it (WithWait).
//
//	go run ./07-fencing-gc-pause                  # filelock + files
//	go run ./07-fencing-gc-pause -backend=redis   # or etcd
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/backend"
	"github.com/ubgo/lock/etcdlock"
	"github.com/ubgo/lock/examples/internal/replica"
	"github.com/ubgo/lock/filelock"
	"github.com/ubgo/lock/redislock"
)

// FencedStore is an object store whose writes carry a fencing token.
type FencedStore interface {
	// Put writes data under key unless a write with a higher fence was
	// accepted for key; then it returns an error matching
	// lock.ErrStaleToken and writes nothing.
	Put(ctx context.Context, key string, data []byte, fence uint64) error
	Get(ctx context.Context, key string) ([]byte, error)
}

// ExportPayments builds today's export and uploads it, unless another
// replica is exporting.
func ExportPayments(ctx context.Context, locks lock.Locker, store FencedStore,
	buildExport func(ctx context.Context) ([]byte, error)) error {
	holder, err := locks.Acquire(ctx, "payments-export")
	if errors.Is(err, lock.ErrLocked) {
		return nil // someone else is exporting
	}
	if err != nil {
		return err
	}
	defer holder.Release()

	fence := holder.Token() // strictly larger than every earlier holder's
	data, err := buildExport(ctx)
	if err != nil {
		return err
	}
	return store.Put(ctx, "payments/today.csv", data, fence)
}

// fileStore is a FencedStore in a directory of this host. filelock's
// Fence.Apply takes the key's fence record's flock, compares, records the
// token (fsynced), runs the write, and only then lets go: no other fenced
// writer of the key, in any process, comes in between.
type fileStore struct {
	fence *filelock.Fence
	dir   string
}

func (s *fileStore) path(key string) string { return filepath.Join(s.dir, backend.Escape(key)) }

func (s *fileStore) Put(ctx context.Context, key string, data []byte, fence uint64) error {
	return s.fence.Apply(ctx, key, fence, func() error {
		if err := os.MkdirAll(s.dir, 0o755); err != nil {
			return err
		}
		return os.WriteFile(s.path(key), data, 0o644)
	})
}

func (s *fileStore) Get(ctx context.Context, key string) ([]byte, error) {
	return os.ReadFile(s.path(key))
}

// etcdStore is a FencedStore in etcd: etcdlock's Fence.Apply puts the data
// in the same Txn that compares and records the token.
type etcdStore struct {
	fence  *etcdlock.Fence
	cli    *clientv3.Client
	prefix string
}

func (s *etcdStore) Put(ctx context.Context, key string, data []byte, fence uint64) error {
	return s.fence.Apply(ctx, key, fence, clientv3.OpPut(s.prefix+"objects/"+key, string(data)))
}

func (s *etcdStore) Get(ctx context.Context, key string) ([]byte, error) {
	resp, err := s.cli.Get(ctx, s.prefix+"objects/"+key)
	if err != nil || len(resp.Kvs) == 0 {
		return nil, err
	}
	return resp.Kvs[0].Value, nil
}

// redisStore is a FencedStore in Redis: redislock's Fence.Apply compares
// the token with the key's fence record, records it and writes the data in
// one script, so the check and the write are one step. The data key is
// built with Fence.DataKey and shares the fence record's hash tag, so the
// script runs on one cluster slot.
type redisStore struct {
	fence *redislock.Fence
	rdb   *redis.Client
}

func (s *redisStore) dataKey(key string) string { return s.fence.DataKey(key, "") }

func (s *redisStore) Put(ctx context.Context, key string, data []byte, fence uint64) error {
	return s.fence.Apply(ctx, key, fence, s.dataKey(key), data)
}

func (s *redisStore) Get(ctx context.Context, key string) ([]byte, error) {
	return s.rdb.Get(ctx, s.dataKey(key)).Bytes()
}

// newStore returns the store replica r writes to: in the same service as
// its locks, or the lock directory's host.
func newStore(c *replica.Cluster, r *replica.Replica) FencedStore {
	switch c.Backend {
	case replica.Redis:
		return &redisStore{fence: redislock.NewFence(r.Redis, redislock.WithKeyPrefix(c.Prefix)), rdb: r.Redis}
	case replica.Etcd:
		return &etcdStore{fence: etcdlock.NewFence(r.Etcd, etcdlock.WithKeyPrefix(c.Prefix)), cli: r.Etcd, prefix: c.Prefix}
	}
	return &fileStore{fence: filelock.NewFence(filelock.WithDir(c.Dir)), dir: filepath.Join(c.Dir, "objects")}
}

// config sizes the demo.
type config struct {
	TTL time.Duration // lease; A pauses past it
}

// result is what the demo saw.
type result struct {
	AErr   error  // A's upload after its pause
	BErr   error  // B's upload
	Stored string // what the store kept
}

func run(ctx context.Context, c *replica.Cluster, cfg config) (res result, err error) {
	ttl := cfg.TTL
	if c.Backend == replica.Etcd {
		ttl = max(ttl.Round(time.Second), time.Second) // etcd leases count whole seconds
	}
	a, err := c.Replica(ctx, lock.WithTTL(ttl), lock.WithAutoRenew(false))
	if err != nil {
		return res, err
	}
	b, err := c.Replica(ctx, lock.WithTTL(ttl), lock.WithAutoRenew(false))
	if err != nil {
		return res, err
	}
	// Each process has its own client of the one store.
	storeA, storeB := newStore(c, a), newStore(c, b)

	paused, resume := make(chan struct{}), make(chan struct{})
	aDone := make(chan error, 1)
	go func() {
		aDone <- ExportPayments(ctx, a.Locker(), storeA, func(ctx context.Context) ([]byte, error) {
			close(paused)
			fmt.Println("A: export built; GC pause...")
			<-resume // A is paused here, past its lease
			fmt.Println("A: ...resumed, uploading")
			return []byte("export by A"), nil
		})
	}()
	select {
	case <-paused:
	case err := <-aDone:
		return res, fmt.Errorf("replica A did not get to its pause: %v", err)
	}

	// B waits for the lock, which frees when A's lease runs out.
	res.BErr = ExportPayments(ctx, b.Locker(lock.WithWait()), storeB, func(ctx context.Context) ([]byte, error) {
		fmt.Println("B: took the lock after A's lease ran out; uploading")
		return []byte("export by B"), nil
	})
	if res.BErr != nil {
		close(resume)
		<-aDone
		return res, fmt.Errorf("replica B: %w", res.BErr)
	}
	close(resume)
	res.AErr = <-aDone
	fmt.Printf("A's upload: %v\n", res.AErr)
	data, err := storeB.Get(ctx, "payments/today.csv")
	res.Stored = string(data)
	fmt.Printf("the store keeps: %q\n", res.Stored)
	return res, err
}

func main() {
	replica.Main(demo, replica.Filelock, replica.Redis, replica.Etcd)
}

func demo(ctx context.Context, c *replica.Cluster) error {
	_, err := run(ctx, c, config{TTL: 300 * time.Millisecond})
	return err
}
