//go:build linux

package chaos

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/ubgo/lock/internal/testenv"
)

// proxy forwards TCP connections from clients to a server and, on
// command, drops every connection or stalls all traffic (a partition:
// bytes, closes and new connections are held until it heals). The fault
// matrix also has it hold only the replies, reset every connection until
// it heals (refuse), and act on the first request that carries a marker
// (arm): the faults of an acquiring round trip.
type proxy struct {
	ln       net.Listener
	upstream string

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	gate   chan struct{} // closed while traffic flows
	down   chan struct{} // closed while replies (server to client) flow
	held   chan struct{} // closed once a reply waits at a shut down gate
	refuse bool          // reset every connection, new ones too
	trap   *trap         // armed: acts on the first request with its marker
	closed bool
}

// A trap acts on the first request (client to server chunk) that contains
// marker: before runs first, then the chunk is forwarded whatever the
// gates say.
type trap struct {
	marker []byte
	before func()
	sprung chan struct{} // closed once the chunk is forwarded
}

func startProxy(t testing.TB, upstream string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, upstream: upstream, conns: map[net.Conn]struct{}{}, gate: make(chan struct{}), down: make(chan struct{})}
	close(p.gate)
	close(p.down)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

func (p *proxy) addr() string { return p.ln.Addr().String() }

func (p *proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		go p.serve(c)
	}
}

func (p *proxy) open() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.gate
}

func (p *proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *proxy) untrack(c net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.conns, c)
}

func (p *proxy) serve(c net.Conn) {
	<-p.open()
	if p.refusing() {
		reset(c)
		return
	}
	s, err := net.DialTimeout("tcp", p.upstream, 2*time.Second)
	if err != nil {
		c.Close()
		return
	}
	if !p.track(c) || !p.track(s) {
		c.Close()
		s.Close()
		return
	}
	var once sync.Once
	end := func() {
		once.Do(func() {
			c.Close()
			s.Close()
			p.untrack(c)
			p.untrack(s)
		})
	}
	go p.pipe(s, c, true, end)
	p.pipe(c, s, false, end)
}

// pipe copies from src to dst, holding each chunk (and the end of the
// stream) while the proxy is stalled; up is the client-to-server
// direction, down the replies.
func (p *proxy) pipe(dst, src net.Conn, up bool, end func()) {
	defer end()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		var tr *trap
		if up && n > 0 {
			tr = p.spring(buf[:n])
		}
		if tr != nil {
			tr.before()
		} else {
			p.pass(up, n > 0)
		}
		if n > 0 {
			_, werr := dst.Write(buf[:n])
			if tr != nil {
				close(tr.sprung)
			}
			if werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// pass returns once a chunk may go: the gate is open and, for a reply,
// the down gate too. A reply that waits says so (held).
func (p *proxy) pass(up, data bool) {
	for {
		p.mu.Lock()
		gate, down, held := p.gate, p.down, p.held
		p.mu.Unlock()
		<-gate
		if up {
			return
		}
		select {
		case <-down:
			return
		default:
		}
		if data {
			p.mu.Lock()
			if p.held == held && held != nil {
				close(held)
				p.held = nil
			}
			p.mu.Unlock()
		}
		<-down
	}
}

// spring returns the armed trap, disarmed, if chunk carries its marker.
func (p *proxy) spring(chunk []byte) *trap {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.trap == nil || !bytes.Contains(chunk, p.trap.marker) {
		return nil
	}
	tr := p.trap
	p.trap = nil
	return tr
}

// arm sets a trap for the next request that contains marker; the channel
// returned is closed once that request is forwarded.
func (p *proxy) arm(marker string, before func()) <-chan struct{} {
	tr := &trap{marker: []byte(marker), before: before, sprung: make(chan struct{})}
	p.mu.Lock()
	p.trap = tr
	p.mu.Unlock()
	return tr.sprung
}

// holdReplies shuts the down gate: requests still reach the server, its
// replies wait. The channel returned is closed once a reply waits.
func (p *proxy) holdReplies() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down, p.held = make(chan struct{}), make(chan struct{})
	return p.held
}

// hold stalls all traffic and new connections (a blackhole) until heal.
func (p *proxy) hold() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.gate = make(chan struct{})
}

// refuseAll resets every connection, and each new one, until heal.
func (p *proxy) refuseAll() {
	p.mu.Lock()
	p.refuse = true
	p.mu.Unlock()
	p.drop()
}

func (p *proxy) refusing() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.refuse
}

// heal lets everything through again and disarms the trap.
func (p *proxy) heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, ch := range []chan struct{}{p.gate, p.down} {
		select {
		case <-ch:
		default:
			close(ch)
		}
	}
	p.refuse, p.trap, p.held = false, nil, nil
}

// drop closes every connection at once, as a crashed middlebox would.
func (p *proxy) drop() {
	p.mu.Lock()
	conns := make([]net.Conn, 0, len(p.conns))
	for c := range p.conns {
		conns = append(conns, c)
	}
	p.mu.Unlock()
	for _, c := range conns {
		reset(c)
	}
}

// reset closes c with a reset, not a polite close.
func reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
	c.Close()
}

// stall holds all traffic for d.
func (p *proxy) stall(d time.Duration) {
	p.hold()
	time.Sleep(d)
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.gate:
	default:
		close(p.gate)
	}
}

func (p *proxy) close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.ln.Close()
	p.drop()
}

func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// server is a private server process on its own port, which faults may
// kill and start again on the same data.
type server struct {
	t     testing.TB
	name  string
	args  []string
	env   []string
	ready func() error
	log   string
	// tree: the server is a process and its children (PostgreSQL's
	// postmaster and its backends, each in a session of its own),
	// signalled as one. cred: run as this user (initdb and postgres
	// refuse root).
	tree bool
	cred *syscall.Credential
	dir  string // working directory; "" the test's

	mu  sync.Mutex
	cmd *exec.Cmd
}

func (s *server) start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	f, err := os.OpenFile(s.log, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	cmd := exec.Command(s.args[0], s.args[1:]...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Env, cmd.Dir = s.env, s.dir
	// Dies with the test binary, even one killed by -timeout.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Credential: s.cred}
	if err := cmd.Start(); err != nil {
		return err
	}
	s.cmd = cmd
	if !testenv.Poll(30*time.Second, func() bool { err = s.ready(); return err == nil }) {
		return fmt.Errorf("%s not ready after 30s: %v (log %s)", s.name, err, s.log)
	}
	return nil
}

// kill ends the server with SIGKILL: a crash, not a clean shutdown.
func (s *server) kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	pids := s.signalLocked(syscall.SIGKILL)
	s.cmd.Wait()
	// Every backend gone, so that a restart finds its shared memory free.
	testenv.Poll(10*time.Second, func() bool { return !slices.ContainsFunc(pids, alive) })
	s.cmd = nil
}

// signalLocked sends sig to the server (and, if tree, to its children,
// the parent stopped meanwhile so that it starts none), and returns the
// pids signalled; s.mu is held.
func (s *server) signalLocked(sig syscall.Signal) []int {
	pid := s.cmd.Process.Pid
	if !s.tree {
		s.cmd.Process.Signal(sig)
		return []int{pid}
	}
	if sig != syscall.SIGCONT {
		syscall.Kill(pid, syscall.SIGSTOP)
	}
	pids := childPids(pid)
	for _, c := range pids {
		syscall.Kill(c, sig)
	}
	syscall.Kill(pid, sig)
	return append(pids, pid)
}

// pause stops the server (SIGSTOP) and returns once every thread of it is
// stopped, or an error after 10s.
func (s *server) pause() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return errors.New(s.name + " is not running")
	}
	pids := s.signalLocked(syscall.SIGSTOP)
	if !testenv.Poll(10*time.Second, func() bool {
		return !slices.ContainsFunc(pids, func(pid int) bool { return alive(pid) && !allStopped(pid) })
	}) {
		return fmt.Errorf("%s not stopped within 10s of SIGSTOP", s.name)
	}
	return nil
}

// resume lets a paused server run again (SIGCONT).
func (s *server) resume() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		s.signalLocked(syscall.SIGCONT)
	}
}

// alive reports whether process pid exists and is not a zombie.
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	return len(f) > 0 && f[0] != "Z" && f[0] != "X"
}

// childPids lists the children of pid (/proc).
func childPids(pid int) []int {
	var pids []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		c, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", c))
		if err != nil {
			continue
		}
		// "pid (comm) state ppid ...": comm may hold anything.
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
		if len(f) > 1 && f[1] == strconv.Itoa(pid) {
			pids = append(pids, c)
		}
	}
	return pids
}

func startRedisServer(t testing.TB, dir string) (*server, string, error) {
	testenv.SkipShort(t, "a private redis-server")
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, "", err
	}
	port := freePort(t)
	addr := "127.0.0.1:" + strconv.Itoa(port)
	// appendfsync always: the server keeps its data across a crash, as
	// redislock's exclusion assumes ("one primary ... keeps its data").
	s := &server{t: t, name: "redis-server", log: filepath.Join(dir, "redis.log"), env: os.Environ(),
		args: []string{bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", dir,
			"--save", "", "--appendonly", "yes", "--appendfsync", "always", "--daemonize", "no"},
		ready: func() error { return redisPing(addr) }}
	if err := s.start(); err != nil {
		return nil, "", err
	}
	t.Cleanup(s.kill)
	return s, addr, nil
}

func redisPing(addr string) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Second))
	if _, err := io.WriteString(c, "PING\r\n"); err != nil {
		return err
	}
	b := make([]byte, 64)
	n, err := c.Read(b)
	if err != nil {
		return err
	}
	if !strings.HasPrefix(string(b[:n]), "+PONG") {
		return fmt.Errorf("redis said %q", b[:n])
	}
	return nil
}

func etcdBinary() (string, error) {
	if p, err := exec.LookPath("etcd"); err == nil {
		return p, nil
	}
	out, err := exec.Command("bash", "../scripts/services.sh", "etcd-bin").Output()
	if err != nil {
		return "", fmt.Errorf("scripts/services.sh etcd-bin: %w", err)
	}
	return strings.TrimSpace(string(out)), nil
}

func startEtcdServer(t testing.TB, dir string) (s *server, addr string, err error) {
	testenv.SkipShort(t, "a private etcd")
	bin, err := etcdBinary()
	if err != nil {
		return nil, "", err
	}
	cport, pport := freePort(t), freePort(t)
	addr = "127.0.0.1:" + strconv.Itoa(cport)
	curl, purl := "http://"+addr, "http://127.0.0.1:"+strconv.Itoa(pport)
	// etcd refuses ETCD_* variables that duplicate flags.
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "ETCD_") {
			env = append(env, kv)
		}
	}
	s = &server{t: t, name: "etcd", log: filepath.Join(dir, "etcd.log"), env: env,
		args: []string{bin, "--name", "chaos", "--data-dir", filepath.Join(dir, "etcd-data"),
			"--listen-client-urls", curl, "--advertise-client-urls", curl,
			"--listen-peer-urls", purl, "--initial-advertise-peer-urls", purl,
			"--initial-cluster", "chaos=" + purl, "--log-level", "warn"},
		ready: func() error { return etcdHealthy(curl) }}
	if err := s.start(); err != nil {
		return nil, "", err
	}
	t.Cleanup(s.kill)
	return s, addr, nil
}

func etcdHealthy(url string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", url+"/health", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if !strings.Contains(string(b), `"health":"true"`) && !strings.Contains(string(b), `"health": "true"`) {
		return errors.New("etcd: " + string(b))
	}
	return nil
}

// postgresBin is the directory of the newest installed PostgreSQL's
// initdb and postgres (Debian's layout).
func postgresBin() (string, error) {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	best, bestVer := "", -1
	for _, d := range dirs {
		v, err := strconv.Atoi(filepath.Base(filepath.Dir(d)))
		if err == nil && v > bestVer && fileExists(filepath.Join(d, "initdb")) && fileExists(filepath.Join(d, "postgres")) {
			best, bestVer = d, v
		}
	}
	if best == "" {
		return "", errors.New("no /usr/lib/postgresql/*/bin with initdb and postgres")
	}
	return best, nil
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

// startPostgresServer starts a PostgreSQL cluster of the test's own
// (initdb, trust auth, user postgres, no durability: the faults are
// crashes of the server, not of the machine) on a free loopback port. As
// root it runs as the postgres user, in a directory of its own that user
// can reach. kill and pause reach every backend, as a crash or a
// frozen host would.
func startPostgresServer(t testing.TB) (*server, string, error) {
	testenv.SkipShort(t, "a private PostgreSQL")
	bin, err := postgresBin()
	if err != nil {
		return nil, "", err
	}
	base, err := os.MkdirTemp("", "chaos-pg-")
	if err != nil {
		return nil, "", err
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	data := filepath.Join(base, "data")
	cred, err := postgresCred(base, data)
	if err != nil {
		return nil, "", err
	}
	initdb := exec.Command(filepath.Join(bin, "initdb"), "-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--locale=C", "-N")
	initdb.Dir, initdb.SysProcAttr = base, &syscall.SysProcAttr{Credential: cred}
	if out, err := initdb.CombinedOutput(); err != nil {
		return nil, "", fmt.Errorf("initdb: %v: %s", err, out)
	}
	port := strconv.Itoa(freePort(t))
	addr := "127.0.0.1:" + port
	s := &server{t: t, name: "postgres", log: filepath.Join(base, "postgres.log"), env: os.Environ(), tree: true, cred: cred, dir: base,
		args: []string{filepath.Join(bin, "postgres"), "-D", data, "-p", port, "-h", "127.0.0.1", "-k", "",
			"-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
			"-c", "dynamic_shared_memory_type=mmap", "-c", "max_connections=200", "-c", "shared_buffers=16MB"},
		ready: func() error { return postgresPing(addr) }}
	if err := s.start(); err != nil {
		return nil, "", err
	}
	t.Cleanup(s.shutdown)
	return s, addr, nil
}

// postgresCred makes base reachable and data owned by the postgres user
// when the test runs as root, and returns that user's credential (nil
// otherwise: the server runs as the test's user).
func postgresCred(base, data string) (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, os.Mkdir(data, 0o700)
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, err
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	if err := os.Chmod(base, 0o711); err != nil {
		return nil, err
	}
	if err := os.Mkdir(data, 0o700); err != nil {
		return nil, err
	}
	if err := os.Chown(data, uid, gid); err != nil {
		return nil, err
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// shutdown stops the server cleanly (fast shutdown, which removes its
// shared memory), or kills it after 10s.
func (s *server) shutdown() {
	s.mu.Lock()
	cmd := s.cmd
	if cmd != nil {
		s.signalLocked(syscall.SIGCONT)
		cmd.Process.Signal(syscall.SIGINT)
	}
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	done := make(chan struct{})
	go func() {
		cmd.Wait()
		close(done)
	}()
	select {
	case <-done:
		s.mu.Lock()
		s.cmd = nil
		s.mu.Unlock()
	case <-time.After(10 * time.Second):
		s.kill()
	}
}

func postgresPing(addr string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, "postgres://postgres@"+addr+"/postgres?sslmode=disable")
	if err != nil {
		return err
	}
	defer c.Close(ctx)
	return c.Ping(ctx)
}
