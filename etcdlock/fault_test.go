package etcdlock_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/etcdlock"
	"github.com/ubgo/lock/internal/testenv"
)

// etcdServer is a member of a private etcd cluster (of one member, from
// startEtcd, or more, from startEtcdCluster) started from the system binary
// on free loopback ports, with its data in a test directory. Its election
// timeout is short (500ms), which makes its minimum lease 1s.
type etcdServer struct {
	t       testing.TB
	bin     string
	dir     string
	name    string
	client  string
	peer    string
	cluster string // --initial-cluster
	cmd     *exec.Cmd
}

func freePort(t testing.TB) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func startEtcd(t testing.TB) *etcdServer { return startEtcdCluster(t, 1)[0] }

// startEtcdCluster starts a private cluster of n members and waits until
// each answers.
func startEtcdCluster(t testing.TB, n int) []*etcdServer {
	t.Helper()
	testenv.SkipShort(t, "a private etcd")
	out, err := exec.Command("bash", "../scripts/services.sh", "etcd-bin").Output()
	bin := strings.TrimSpace(string(out))
	if err != nil || bin == "" {
		testenv.Unavailable(t, "etcd binary", fmt.Errorf("scripts/services.sh etcd-bin: %v", err))
	}
	ms := make([]*etcdServer, n)
	var cluster []string
	for i := range ms {
		ms[i] = &etcdServer{
			t: t, bin: bin, dir: t.TempDir(), name: fmt.Sprintf("private%d", i),
			client: fmt.Sprintf("http://127.0.0.1:%d", freePort(t)),
			peer:   fmt.Sprintf("http://127.0.0.1:%d", freePort(t)),
		}
		cluster = append(cluster, ms[i].name+"="+ms[i].peer)
	}
	for _, s := range ms {
		s.cluster = strings.Join(cluster, ",")
		t.Cleanup(s.kill)
		s.launch()
	}
	for _, s := range ms {
		s.ready()
	}
	return ms
}

// start starts a killed member again, from its data.
func (s *etcdServer) start() {
	s.t.Helper()
	s.launch()
	s.ready()
}

func (s *etcdServer) launch() {
	s.t.Helper()
	log, err := os.OpenFile(filepath.Join(s.dir, "etcd.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		s.t.Fatal(err)
	}
	defer log.Close()
	cmd := exec.Command(s.bin,
		"--name", s.name,
		"--data-dir", filepath.Join(s.dir, "data"),
		"--listen-client-urls", s.client, "--advertise-client-urls", s.client,
		"--listen-peer-urls", s.peer, "--initial-advertise-peer-urls", s.peer,
		"--initial-cluster", s.cluster,
		"--heartbeat-interval", "50", "--election-timeout", "500",
	)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "ETCD_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	s.cmd = cmd
}

// ready waits until the member answers a read: a member of a larger
// cluster does so only once a quorum of them runs.
func (s *etcdServer) ready() {
	s.t.Helper()
	var err error
	if !testenv.Poll(30*time.Second, func() bool {
		var cli *clientv3.Client
		if cli, err = dial(s.t, s.endpoints()); err == nil {
			cli.Close()
		}
		return err == nil
	}) {
		s.t.Fatalf("private etcd did not come up: %v (log in %s)", err, s.dir)
	}
}

func (s *etcdServer) endpoints() []string { return []string{strings.TrimPrefix(s.client, "http://")} }

// pause stops the server (SIGSTOP): it keeps its connections open but
// answers nothing until resume.
func (s *etcdServer) pause() {
	s.t.Helper()
	testenv.Pause(s.t, s.cmd.Process)
}

func (s *etcdServer) resume() {
	s.t.Helper()
	if err := testenv.Resume(s.cmd.Process); err != nil {
		s.t.Fatal(err)
	}
}

func (s *etcdServer) kill() {
	if s.cmd == nil {
		return
	}
	testenv.Resume(s.cmd.Process)
	s.cmd.Process.Kill()
	s.cmd.Wait()
	s.cmd = nil
}

func (s *etcdServer) dial(t testing.TB) *clientv3.Client {
	t.Helper()
	cli, err := dial(t, s.endpoints())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// A server that stops answering for longer than the TTL: the holder declares
// the loss on its own, before the lease can have run out on the server, and
// once the server is back another client takes the lock with a larger token.
func TestFaultServerPaused(t *testing.T) {
	srv := startEtcd(t)
	cli := srv.dial(t)
	ctx := ctxT(t, time.Minute)
	f := factory(t, cli, etcdlock.WithTTL(time.Second))
	h, err := f.Acquire(ctx, "paused")
	if err != nil {
		t.Fatal(err)
	}
	if ttl, err := cli.TimeToLive(ctx, h.Lease()); err != nil || ttl.GrantedTTL != 1 {
		t.Fatalf("lease granted %+v, %v; want a 1s lease", ttl, err)
	}
	stopped := time.Now()
	srv.pause()
	waitClosed(t, h.Done(), 10*time.Second, "loss while the server is stopped")
	t.Logf("loss seen %v after the server stopped (TTL 1s)", time.Since(stopped).Round(time.Millisecond))
	if !errors.Is(h.Err(), etcdlock.ErrLockLost) || !errors.Is(h.Err(), lock.ErrLockLost) {
		t.Fatalf("Err = %v; want ErrLockLost", h.Err())
	}
	time.Sleep(2*time.Second - time.Since(stopped)) // stopped for twice the TTL
	srv.resume()

	g := factory(t, srv.dial(t), etcdlock.WithTTL(time.Second))
	h2, err := g.Acquire(ctx, "paused", etcdlock.WithWait())
	if err != nil {
		t.Fatal(err)
	}
	if h2.Token() <= h.Token() {
		t.Fatalf("token %d after %d", h2.Token(), h.Token())
	}
	if err := h.Release(); !errors.Is(err, lock.ErrLockLost) {
		t.Fatalf("late Release = %v; want ErrLockLost", err)
	}
	info, err := g.Inspect(ctx, "paused")
	if err != nil || len(info.Holders) != 1 || info.Holders[0].Token != h2.Token() {
		t.Fatalf("after the late Release: %+v, %v; want the successor still holding", info, err)
	}
	// The first factory takes a new lease, never the lost one.
	if err := h2.Release(); err != nil {
		t.Fatal(err)
	}
	h3, err := f.Acquire(ctx, "paused", etcdlock.WithWait())
	if err != nil {
		t.Fatal(err)
	}
	if h3.Lease() == h.Lease() || h3.Token() <= h2.Token() {
		t.Fatalf("re-acquire: lease %x (lost one %x), token %d after %d", h3.Lease(), h.Lease(), h3.Token(), h2.Token())
	}
	h3.Release()
}

// A server killed and restarted from its data: the holder sees the loss
// while it is down; afterwards another client acquires with a larger token.
func TestFaultServerKilled(t *testing.T) {
	srv := startEtcd(t)
	cli := srv.dial(t)
	ctx := ctxT(t, time.Minute)
	f := factory(t, cli, etcdlock.WithTTL(time.Second))
	h, err := f.Acquire(ctx, "killed")
	if err != nil {
		t.Fatal(err)
	}
	srv.kill()
	waitClosed(t, h.Done(), 10*time.Second, "loss while the server is down")
	if !errors.Is(h.Err(), lock.ErrLockLost) {
		t.Fatalf("Err = %v", h.Err())
	}
	time.Sleep(1500 * time.Millisecond)
	srv.start()
	g := factory(t, srv.dial(t), etcdlock.WithTTL(time.Second))
	h2, err := g.Acquire(ctx, "killed", etcdlock.WithWait())
	if err != nil {
		t.Fatal(err)
	}
	if h2.Token() <= h.Token() {
		t.Fatalf("token %d after %d", h2.Token(), h.Token())
	}
	if err := h.Release(); !errors.Is(err, lock.ErrLockLost) {
		t.Fatalf("late Release = %v", err)
	}
	if _, err := f.Acquire(ctx, "killed"); !errors.Is(err, etcdlock.ErrLocked) {
		t.Fatalf("the old client's Acquire while the successor holds = %v; want ErrLocked", err)
	}
	h2.Release()
}

// The lock outlives the Acquire context: cancelled right after the acquire,
// it stays held and renewed through several TTLs until Release.
func TestAcquireContextCancelled(t *testing.T) {
	srv := startEtcd(t)
	cli := srv.dial(t)
	f := factory(t, cli, etcdlock.WithTTL(time.Second))
	g := factory(t, srv.dial(t), etcdlock.WithTTL(time.Second))
	actx, cancel := context.WithCancel(context.Background())
	h, err := f.Acquire(actx, "outlives")
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-h.Done():
		t.Fatalf("lost after its Acquire context ended: %v", h.Err())
	case <-time.After(3 * time.Second): // three TTLs
	}
	ctx := ctxT(t, time.Minute)
	if g2, err := g.Acquire(ctx, "outlives"); !errors.Is(err, etcdlock.ErrLocked) {
		// On a starved machine a renewal can come too late for a 1s
		// lease. That is a loss the holder must report (at once: its
		// deadline passed before the server's expiry); only then is it
		// the load, not the context, that ended the lock.
		select {
		case <-h.Done():
			if g2 != nil {
				g2.Release()
			}
			t.Skipf("the lease ran out under load (another client's Acquire = %v, and the holder reported %v)", err, h.Err())
		case <-time.After(10 * time.Second):
		}
		t.Fatalf("another client's Acquire = %v; want ErrLocked", err)
	}
	if err := h.Extend(ctx); err != nil {
		t.Fatal(err)
	}
	if err := h.Release(); err != nil {
		t.Fatal(err)
	}
	h2, err := g.Acquire(ctx, "outlives")
	if err != nil {
		t.Fatal(err)
	}
	h2.Release()
}

const childPrefixEnv = "ETCDLOCK_TEST_PREFIX"

// TestChildHolder is the child process of the holder fault tests: it takes
// a lock, says so, and reports its loss.
func TestChildHolder(t *testing.T) {
	if testenv.Child() != "holder" {
		t.Skip("child process of TestFaultHolder*")
	}
	cli, err := dial(t, testenv.EtcdEndpoints())
	if err != nil {
		t.Fatal(err)
	}
	f := etcdlock.NewFactory(cli, etcdlock.WithKeyPrefix(os.Getenv(childPrefixEnv)), etcdlock.WithTTL(2*time.Second), etcdlock.WithLogger(nil))
	h, err := f.Acquire(context.Background(), "child")
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("held %d\n", h.Token())
	<-h.Done()
	fmt.Printf("lost %v\n", errors.Is(h.Err(), lock.ErrLockLost))
	time.Sleep(time.Minute)
}

func startHolder(t *testing.T, prefix string) (*exec.Cmd, *bufio.Scanner, uint64) {
	cmd := testenv.Command(t, "holder", "TestChildHolder", childPrefixEnv+"="+prefix)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	lines := bufio.NewScanner(out)
	for lines.Scan() {
		if tok, ok := strings.CutPrefix(lines.Text(), "held "); ok {
			n, err := strconv.ParseUint(tok, 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return cmd, lines, n
		}
	}
	t.Fatalf("child exited before holding the lock: %v", lines.Err())
	return nil, nil, 0
}

// A holder process killed with SIGKILL frees its lock within the TTL.
func TestFaultHolderKilled(t *testing.T) {
	cli := client(t)
	prefix := testPrefix(t)
	child, _, token := startHolder(t, prefix)
	f := factory(t, cli, etcdlock.WithKeyPrefix(prefix))
	ctx := ctxT(t, time.Minute)
	if _, err := f.Acquire(ctx, "child"); !errors.Is(err, etcdlock.ErrLocked) {
		t.Fatalf("Acquire while the child holds = %v; want ErrLocked", err)
	}
	child.Process.Kill()
	h, err := f.Acquire(ctx, "child", etcdlock.WithWait())
	if err != nil {
		t.Fatal(err)
	}
	if h.Token() <= token {
		t.Fatalf("token %d after the child's %d", h.Token(), token)
	}
	h.Release()
}

// A holder process paused (SIGSTOP) past its TTL loses the lock to another
// process, and when it resumes it learns of the loss rather than carrying on.
func TestFaultHolderPaused(t *testing.T) {
	cli := client(t)
	prefix := testPrefix(t)
	child, lines, token := startHolder(t, prefix)
	f := factory(t, cli, etcdlock.WithKeyPrefix(prefix))
	ctx := ctxT(t, time.Minute)
	testenv.Pause(t, child.Process)
	h, err := f.Acquire(ctx, "child", etcdlock.WithWait())
	if err != nil {
		t.Fatal(err)
	}
	if h.Token() <= token {
		t.Fatalf("token %d after the child's %d", h.Token(), token)
	}
	if err := testenv.Resume(child.Process); err != nil {
		t.Fatal(err)
	}
	got := make(chan string, 1)
	go func() {
		if lines.Scan() {
			got <- lines.Text()
		}
		close(got)
	}()
	select {
	case line := <-got:
		if line != "lost true" {
			t.Fatalf("resumed child said %q; want \"lost true\"", line)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("resumed child did not report the loss")
	}
	if h.Err() != nil {
		t.Fatalf("the resumed child disturbed the new holder: %v", h.Err())
	}
	h.Release()
}

// A lock that is not renewed in the background lives as long as Extend keeps
// it, and is lost a TTL after the last Extend; a waiter with such a lock
// keeps its place however long it waits.
func TestManualRenewal(t *testing.T) {
	srv := startEtcd(t)
	cli := srv.dial(t)
	ctx := ctxT(t, time.Minute)
	f := factory(t, cli, etcdlock.WithTTL(time.Second), etcdlock.WithAutoRenew(false))
	g := factory(t, srv.dial(t), etcdlock.WithTTL(time.Second))
	h, err := f.Acquire(ctx, "manual")
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 8; i++ { // 2.4s, more than two TTLs
		time.Sleep(300 * time.Millisecond)
		if err := h.Extend(ctx); err != nil {
			t.Fatalf("Extend %d: %v", i, err)
		}
	}
	waitClosed(t, h.Done(), 5*time.Second, "loss once Extend stopped")
	if !errors.Is(h.Err(), etcdlock.ErrLockLost) {
		t.Fatalf("Err = %v", h.Err())
	}
	if err := h.Extend(ctx); !errors.Is(err, lock.ErrLockLost) {
		t.Fatalf("Extend after the loss = %v", err)
	}

	// A waiter whose lease only Extend renews.
	holder, err := g.Acquire(ctx, "manual")
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		w, err := f.Acquire(ctx, "manual", etcdlock.WithWait())
		if err == nil {
			err = w.Release()
		}
		got <- err
	}()
	time.Sleep(2500 * time.Millisecond)
	if err := holder.Release(); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
}

// proxy forwards TCP connections to target until cut.
type proxy struct {
	l      net.Listener
	target string
	mu     sync.Mutex
	cut    bool
	conns  map[net.Conn]struct{}
}

func startProxy(t testing.TB, target string) *proxy {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{l: l, target: target, conns: map[net.Conn]struct{}{}}
	t.Cleanup(func() { l.Close(); p.setCut(true) })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			if p.cut {
				p.mu.Unlock()
				c.Close()
				continue
			}
			u, err := net.Dial("tcp", target)
			if err != nil {
				p.mu.Unlock()
				c.Close()
				continue
			}
			p.conns[c], p.conns[u] = struct{}{}, struct{}{}
			p.mu.Unlock()
			go func() { io.Copy(u, c); u.Close() }()
			go func() { io.Copy(c, u); c.Close() }()
		}
	}()
	return p
}

// dial connects a client through the proxy that reconnects quickly once
// the proxy lets connections through again.
func (p *proxy) dial(t testing.TB) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{p.l.Addr().String()},
		DialTimeout: 3 * time.Second,
		Logger:      zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.2, MaxDelay: 200 * time.Millisecond},
			MinConnectTimeout: time.Second,
		})},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// setCut drops every connection and refuses new ones, or lets them through
// again.
func (p *proxy) setCut(cut bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = cut
	if cut {
		for c := range p.conns {
			c.Close()
		}
		clear(p.conns)
	}
}

// While a client is cut off, its key is deleted and etcd compacts past the
// revision its watch had reached: the watch cannot resume, so it is set up
// again and the held keys are read back; the deleted one is reported lost,
// the other is still held.
func TestFaultWatchCompacted(t *testing.T) {
	srv := startEtcd(t)
	admin := srv.dial(t)
	p := startProxy(t, srv.endpoints()[0])
	cli := p.dial(t)
	ctx := ctxT(t, time.Minute)
	f := factory(t, cli, etcdlock.WithTTL(20*time.Second))
	gone, err := f.Acquire(ctx, "gone")
	if err != nil {
		t.Fatal(err)
	}
	kept, err := f.Acquire(ctx, "kept")
	if err != nil {
		t.Fatal(err)
	}
	p.setCut(true)
	if _, err := admin.Delete(ctx, gone.Key()); err != nil {
		t.Fatal(err)
	}
	resp, err := admin.Put(ctx, "filler", "x")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Compact(ctx, resp.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	p.setCut(false)
	waitClosed(t, gone.Done(), 30*time.Second, "loss of the key deleted while the watch was cut off")
	if !errors.Is(gone.Err(), etcdlock.ErrLockLost) {
		t.Fatalf("Err = %v", gone.Err())
	}
	if kept.Err() != nil {
		t.Fatalf("the other lock was lost too: %v", kept.Err())
	}
	if err := kept.Release(); err != nil {
		t.Fatal(err)
	}
}

// A Release that cannot reach etcd returns its error, and the key is deleted
// in the background once etcd is back, while the lease lives on: no lock is
// left held by nobody.
func TestFaultReleaseDuringOutage(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for the release timeout")
	}
	srv := startEtcd(t)
	admin := srv.dial(t)
	p := startProxy(t, srv.endpoints()[0])
	cli := p.dial(t)
	ctx := ctxT(t, time.Minute)
	f := factory(t, cli, etcdlock.WithTTL(30*time.Second))
	h, err := f.Acquire(ctx, "outage")
	if err != nil {
		t.Fatal(err)
	}
	keep, err := f.Acquire(ctx, "keep") // keeps the lease in use
	if err != nil {
		t.Fatal(err)
	}
	p.setCut(true)
	if err := h.Release(); err == nil {
		t.Fatal("Release succeeded with etcd cut off")
	}
	p.setCut(false)
	g := factory(t, admin, etcdlock.WithTTL(30*time.Second))
	h2, err := g.Acquire(ctx, "outage", etcdlock.WithWait())
	if err != nil {
		t.Fatal(err)
	}
	if ttl, err := admin.TimeToLive(ctx, h.Lease()); err != nil || ttl.TTL <= 0 {
		t.Fatalf("the first lease: %+v, %v; want it alive (the key must have been deleted, not expired)", ttl, err)
	}
	if keep.Err() != nil {
		t.Fatalf("the other lock was lost: %v", keep.Err())
	}
	h2.Release()
	keep.Release()
}

// An Acquire whose context ends while its write is in flight returns at
// once; the write, when it lands, is undone.
func TestFaultAcquireAbandonedMidWrite(t *testing.T) {
	srv := startEtcd(t)
	cli := srv.dial(t)
	ctx := ctxT(t, time.Minute)
	f := factory(t, cli, etcdlock.WithTTL(30*time.Second))
	warm, err := f.Acquire(ctx, "warm") // lease and watch in place
	if err != nil {
		t.Fatal(err)
	}
	srv.pause()
	actx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	_, err = f.Acquire(actx, "abandoned")
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		srv.resume()
		t.Fatalf("Acquire with the server stopped = %v; want DeadlineExceeded", err)
	}
	time.Sleep(300 * time.Millisecond)
	srv.resume()
	g := factory(t, srv.dial(t), etcdlock.WithTTL(30*time.Second))
	h, err := g.Acquire(ctx, "abandoned", etcdlock.WithWait())
	if err != nil {
		t.Fatal(err)
	}
	if ttl, err := cli.TimeToLive(ctx, warm.Lease()); err != nil || ttl.TTL <= 0 {
		t.Fatalf("the first lease: %+v, %v; want it alive", ttl, err)
	}
	h.Release()
	warm.Release()
}

// A holder already lost sends nothing on Release: its key is gone or goes
// with its lease, and etcd may be the reason it was lost.
func TestReleaseAfterLossSendsNothing(t *testing.T) {
	var txns atomic.Int64
	count := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoke grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if strings.HasSuffix(method, "/Txn") {
			txns.Add(1)
		}
		return invoke(ctx, method, req, reply, cc, opts...)
	}
	testenv.SkipShort(t, "etcd")
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   testenv.EtcdEndpoints(),
		DialTimeout: 3 * time.Second,
		Logger:      zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(count)},
	})
	if err != nil {
		testenv.Unavailable(t, "etcd", err)
	}
	t.Cleanup(func() { cli.Close() })
	f := factory(t, cli, etcdlock.WithKeyPrefix(testPrefix(t)))
	ctx := ctxT(t, time.Minute)
	h, err := f.Acquire(ctx, "lost")
	if err != nil {
		testenv.Unavailable(t, "etcd", err)
	}
	if _, err := client(t).Delete(ctx, h.Key()); err != nil {
		t.Fatal(err)
	}
	waitClosed(t, h.Done(), 10*time.Second, "loss after the key was deleted")
	before := txns.Load()
	if err := h.Release(); !errors.Is(err, etcdlock.ErrLockLost) {
		t.Fatalf("Release after loss = %v, want ErrLockLost", err)
	}
	if n := txns.Load() - before; n != 0 {
		t.Fatalf("Release after loss sent %d transactions, want 0", n)
	}
}

// A waiting Acquire whose context has no deadline, on a factory with no
// watch yet (new, or idle for more than 2s), while etcd does not answer
// (stopped with SIGSTOP) or is down: the watch set-up gives up after its
// bound, 10s (backend.ReleaseTimeout, as for the lease grant), and Acquire
// returns an error that is not contention, instead of waiting for the whole
// outage. Once etcd is back the factory works again.
func TestFaultWatchSetupBounded(t *testing.T) {
	const bound = 10 * time.Second // the documented watch set-up bound
	for _, how := range []string{"paused", "killed"} {
		t.Run(how, func(t *testing.T) {
			srv := startEtcd(t)
			f := factory(t, srv.dial(t), etcdlock.WithTTL(time.Second))
			if how == "paused" {
				srv.pause()
			} else {
				srv.kill()
			}
			got := make(chan error, 1)
			start := time.Now()
			go func() {
				h, err := f.Acquire(context.Background(), "unanswered", etcdlock.WithWait())
				if err == nil {
					h.Release()
				}
				got <- err
			}()
			select {
			case err := <-got:
				t.Logf("Acquire returned after %v: %v", time.Since(start).Round(time.Millisecond), err)
				if err == nil || errors.Is(err, lock.ErrLocked) {
					t.Fatalf("Acquire with etcd %s = %v; want a failure that is not contention", how, err)
				}
			case <-time.After(bound + 20*time.Second):
				t.Fatalf("a waiting Acquire without a deadline did not return within %v of etcd being %s (bound %v)", bound+20*time.Second, how, bound)
			}
			if how == "paused" {
				srv.resume()
			} else {
				srv.start()
			}
			h, err := f.Acquire(ctxT(t, time.Minute), "unanswered", etcdlock.WithWait())
			if err != nil {
				t.Fatalf("Acquire once etcd is back: %v", err)
			}
			h.Release()
		})
	}
}
