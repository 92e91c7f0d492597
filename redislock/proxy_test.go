package redislock

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// holdProxy is a TCP proxy to a Redis server that reads the commands its
// clients send, so that a test can hold one back: the first command that
// matches is kept until the test closes release, then sent on, on its own
// connection, after which sent is closed once the server has answered.
type holdProxy struct {
	t        *testing.T
	l        net.Listener
	upstream string
	match    func(args []string) bool

	held    chan struct{} // closed once the command is held
	release chan struct{} // closed by the test
	sent    chan struct{} // closed once the server answered the held command
	once    sync.Once

	mu    sync.Mutex
	conns []net.Conn
}

func startHoldProxy(t *testing.T, upstream string, match func(args []string) bool) *holdProxy {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &holdProxy{t: t, l: l, upstream: upstream, match: match,
		held: make(chan struct{}), release: make(chan struct{}), sent: make(chan struct{})}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go p.serve(c)
		}
	}()
	t.Cleanup(p.close)
	return p
}

func (p *holdProxy) addr() string { return p.l.Addr().String() }

func (p *holdProxy) close() {
	p.l.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
}

func (p *holdProxy) serve(c net.Conn) {
	up, err := net.Dial("tcp", p.upstream)
	if err != nil {
		c.Close()
		return
	}
	p.mu.Lock()
	p.conns = append(p.conns, c, up)
	p.mu.Unlock()
	defer up.Close()
	replied := make(chan struct{}, 1)
	go func() {
		defer c.Close()
		buf := make([]byte, 32<<10)
		for {
			n, err := up.Read(buf)
			if n > 0 {
				// Signal before the client can see the reply, so that
				// by the time it sends its next command this one's
				// signal is pending.
				select {
				case replied <- struct{}{}:
				default:
				}
				c.Write(buf[:n])
			}
			if err != nil {
				return
			}
		}
	}()
	r := bufio.NewReader(c)
	for {
		raw, args, err := readCommand(r)
		if err != nil {
			return
		}
		hold := false
		if p.match(args) {
			p.once.Do(func() { hold = true })
		}
		if !hold {
			if _, err := up.Write(raw); err != nil {
				return
			}
			continue
		}
		close(p.held)
		<-p.release
		select { // the previous command's reply
		case <-replied:
		default:
		}
		up.Write(raw)
		<-replied
		close(p.sent)
	}
}

// readCommand reads one command as clients send it: an array of bulk
// strings.
func readCommand(r *bufio.Reader) (raw []byte, args []string, err error) {
	line, err := r.ReadBytes('\n')
	if err != nil {
		return nil, nil, err
	}
	if len(line) < 4 || line[0] != '*' {
		return nil, nil, fmt.Errorf("not an array: %q", line)
	}
	n, err := strconv.Atoi(string(line[1 : len(line)-2]))
	if err != nil {
		return nil, nil, err
	}
	raw = line
	for range n {
		hdr, err := r.ReadBytes('\n')
		if err != nil {
			return nil, nil, err
		}
		if len(hdr) < 4 || hdr[0] != '$' {
			return nil, nil, fmt.Errorf("not a bulk string: %q", hdr)
		}
		size, err := strconv.Atoi(string(hdr[1 : len(hdr)-2]))
		if err != nil {
			return nil, nil, err
		}
		b := make([]byte, size+2)
		if _, err := io.ReadFull(r, b); err != nil {
			return nil, nil, err
		}
		raw = append(append(raw, hdr...), b...)
		args = append(args, string(b[:size]))
	}
	return raw, args, nil
}

// isAcquire matches a run of an acquire script.
func isAcquire(args []string) bool {
	if len(args) < 2 {
		return false
	}
	switch strings.ToUpper(args[0]) {
	case "EVALSHA":
		return args[1] == mutexAcquire.Hash() || args[1] == semAcquire.Hash()
	case "EVAL":
		return args[1] == mutexAcquireSrc || args[1] == semAcquireSrc
	}
	return false
}

// await fails the test if ch is not closed within d.
func await(t *testing.T, ch <-chan struct{}, d time.Duration, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(d):
		t.Fatalf("%s: not within %v", what, d)
	}
}
