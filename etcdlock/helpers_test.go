package etcdlock_test

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/etcdlock"
	"github.com/ubgo/lock/internal/testenv"
)

// dial connects to endpoints and checks that etcd answers.
func dial(t testing.TB, endpoints []string) (*clientv3.Client, error) {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   endpoints,
		DialTimeout: 3 * time.Second,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		return nil, err
	}
	if err := testenv.Ping(context.Background(), probe(cli)); err != nil {
		cli.Close()
		return nil, err
	}
	return cli, nil
}

// probe is a round trip to etcd through cli, for testenv.Ping.
func probe(cli *clientv3.Client) func(context.Context) error {
	return func(ctx context.Context) error {
		_, err := cli.Get(ctx, "ubgo-lock-probe")
		return err
	}
}

// client returns a client of the shared test server, closed at cleanup.
func client(t testing.TB) *clientv3.Client {
	t.Helper()
	testenv.SkipShort(t, "etcd")
	cli, err := dial(t, testenv.EtcdEndpoints())
	if err != nil {
		testenv.Unavailable(t, "etcd", err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// factory returns a factory closed at cleanup.
func factory(t testing.TB, cli *clientv3.Client, opts ...etcdlock.Option) *etcdlock.Factory {
	t.Helper()
	f := etcdlock.NewFactory(cli, opts...)
	t.Cleanup(func() { f.Close() })
	return f
}

// testPrefix is a key prefix no earlier run used.
func testPrefix(t testing.TB) string {
	return "ubgo-lock-test/" + time.Now().Format("150405.000000000") + "/"
}

func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func waitClosed(t testing.TB, ch <-chan struct{}, d time.Duration, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(d):
		t.Fatalf("%s: not within %v", what, d)
	}
}

// waitWaiting polls Inspect until n Acquires wait for name, failing after
// 30s or on an Inspect error, and returns what Inspect last said.
func waitWaiting(t testing.TB, f *etcdlock.Factory, name string, n int) lock.Info {
	t.Helper()
	var info lock.Info
	var err error
	if !testenv.Poll(30*time.Second, func() bool {
		info, err = f.Inspect(ctxT(t, 10*time.Second), name)
		return err != nil || info.Waiting == n
	}) || err != nil {
		t.Fatalf("waiting for %d waiters on %q: %v (last %+v)", n, name, err, info)
	}
	return info
}
