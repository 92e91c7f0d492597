//go:build linux

package chaos

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// proxy forwards TCP connections from clients to a server and, on
// command, drops every connection or stalls all traffic (a partition:
// bytes, closes and new connections are held until it heals).
type proxy struct {
	ln       net.Listener
	upstream string

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	gate   chan struct{} // closed while traffic flows
	closed bool
}

func startProxy(t testing.TB, upstream string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, upstream: upstream, conns: map[net.Conn]struct{}{}, gate: make(chan struct{})}
	close(p.gate)
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
	go p.pipe(s, c, end)
	p.pipe(c, s, end)
}

// pipe copies from src to dst, holding each chunk (and the end of the
// stream) while the proxy is stalled.
func (p *proxy) pipe(dst, src net.Conn, end func()) {
	defer end()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		<-p.open()
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
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
		if tc, ok := c.(*net.TCPConn); ok {
			tc.SetLinger(0) // a reset, not a polite close
		}
		c.Close()
	}
}

// stall holds all traffic for d.
func (p *proxy) stall(d time.Duration) {
	p.mu.Lock()
	gate := make(chan struct{})
	p.gate = gate
	p.mu.Unlock()
	time.Sleep(d)
	close(gate)
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
	cmd.Env = s.env
	// Dies with the test binary, even one killed by -timeout.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return err
	}
	s.cmd = cmd
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := s.ready()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready after 30s: %v (log %s)", s.name, err, s.log)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// kill ends the server with SIGKILL: a crash, not a clean shutdown.
func (s *server) kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	s.cmd.Process.Kill()
	s.cmd.Wait()
	s.cmd = nil
}

func startRedisServer(t testing.TB, dir string) (*server, string, error) {
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
