package etcdlock_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/etcdlock"
)

func Example() {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:2379"}, DialTimeout: 5 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	defer cli.Close()
	locks := etcdlock.NewFactory(cli, etcdlock.WithTTL(30*time.Second))
	defer locks.Close()

	err = locks.WithLock(context.Background(), "hourly-aggregate", func(ctx context.Context) error {
		// ctx is cancelled if the lock is lost.
		return nil
	})
	if errors.Is(err, etcdlock.ErrLocked) {
		log.Println("another replica is aggregating")
	}
}

// Leader election (seed scenario 6): the token is the leader epoch, and the
// lease is kept alive for as long as the process holds the lock.
func ExampleFactory_Acquire() {
	var cli *clientv3.Client // connected elsewhere
	ctx := context.Background()
	locks := etcdlock.NewFactory(cli, etcdlock.WithTTL(30*time.Second))

	for ctx.Err() == nil {
		holder, err := locks.Acquire(ctx, "leader")
		if errors.Is(err, etcdlock.ErrLocked) {
			time.Sleep(5 * time.Second)
			continue
		}
		if err != nil {
			slog.Error("etcd error; backing off", "err", err)
			time.Sleep(10 * time.Second)
			continue
		}
		slog.Info("became leader", "fence", holder.Token())
		select {
		case <-holder.Done(): // lost: someone else may lead now
			slog.Warn("leadership lost", "err", holder.Err())
		case <-ctx.Done():
		}
		_ = holder.Release()
	}
}

// Backup orchestration (seed scenario 10): one host per day runs the backup.
func ExampleFactory_WithLock() {
	var cli *clientv3.Client // connected elsewhere
	ctx := context.Background()
	locks := etcdlock.NewFactory(cli,
		etcdlock.WithTTL(2*time.Hour),
		etcdlock.WithKeyPrefix("backups"),
	)
	err := locks.WithLock(ctx, fmt.Sprintf("backup-%s", time.Now().UTC().Format("2006-01-02")),
		func(ctx context.Context) error {
			return nil // run the backup; ctx ends if the lock is lost
		})
	if errors.Is(err, etcdlock.ErrLocked) {
		return // another host is doing today's backup
	}
}

// A waiting semaphore: at most three holders, served in arrival order.
func ExampleWithMaxConcurrent() {
	var locks *etcdlock.Factory // made with NewFactory
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	h, err := locks.Acquire(ctx, "indexer", etcdlock.WithMaxConcurrent(3), etcdlock.WithWait())
	if err != nil {
		log.Fatal(err) // matches lock.ErrLocked and context.DeadlineExceeded if the wait ran out
	}
	defer h.Release()
}

// etcd leases count whole seconds: a TTL that is not is refused before any
// request is made.
func ExampleWithTTL() {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:1"}})
	if err != nil {
		log.Fatal(err)
	}
	defer cli.Close()
	locks := etcdlock.NewFactory(cli, etcdlock.WithTTL(1500*time.Millisecond), etcdlock.WithLogger(nil))
	_, err = locks.Acquire(context.Background(), "job")
	fmt.Println(errors.Is(err, lock.ErrInvalidOption))
	// Output: true
}
