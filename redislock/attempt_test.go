package redislock

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/ubgo/lock/backend"
)

// silentServer accepts connections and never answers, like a server that
// hangs. kill closes the listener and every connection it accepted.
type silentServer struct {
	l     net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

func startSilent(t *testing.T) *silentServer {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &silentServer{l: l}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.conns = append(s.conns, c)
			s.mu.Unlock()
		}
	}()
	t.Cleanup(s.kill)
	return s
}

func (s *silentServer) kill() {
	s.l.Close()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.conns {
		c.Close()
	}
}

// trackedConn records that the client closed it.
type trackedConn struct {
	net.Conn
	closed atomic.Bool
}

func (c *trackedConn) Close() error {
	c.closed.Store(true)
	return c.Conn.Close()
}

// trackingDialer returns a go-redis Dialer that sends every connection it
// makes on dialed.
func trackingDialer(dialed chan<- *trackedConn) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		var d net.Dialer
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		tc := &trackedConn{Conn: c}
		dialed <- tc
		return tc, nil
	}
}

// Acquire against a server that accepts connections but never answers
// returns when its ctx ends. The cleanup of the failed attempt (a release
// by its id, in case the acquire ran) goes on in the background, and Close
// waits for it.
func TestAcquireOnSilentServerKeepsItsContext(t *testing.T) {
	srv := startSilent(t)
	dialed := make(chan *trackedConn, 64)
	rdb := redis.NewClient(&redis.Options{Addr: srv.l.Addr().String(), ContextTimeoutEnabled: true, Dialer: trackingDialer(dialed)})
	defer rdb.Close()
	f := NewFactory(rdb, WithKeyPrefix(testPrefix), WithLogger(nil), WithTTL(time.Minute))
	defer f.Close()
	const timeout = 300 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	start := time.Now()
	_, err := f.Acquire(ctx, uniq(t, "x"))
	took := time.Since(start)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire = %v; want context.DeadlineExceeded", err)
	}
	t.Logf("Acquire with a %v ctx returned after %v", timeout, took.Round(time.Millisecond))
	// The cleanup must still be waiting for the server, on a connection
	// the client has not given up: Acquire did not wait for it.
	var conns []*trackedConn
	pending := func() *trackedConn {
		for _, c := range conns {
			if !c.closed.Load() {
				return c
			}
		}
		return nil
	}
	bound := time.NewTimer(backend.ReleaseTimeout)
	defer bound.Stop()
collect:
	for {
		select {
		case c := <-dialed:
			conns = append(conns, c)
			continue
		default:
		}
		if pending() != nil {
			break
		}
		select {
		case c := <-dialed:
			conns = append(conns, c)
		case <-bound.C:
			break collect
		}
	}
	if pending() == nil {
		t.Fatalf("Acquire returned after %v, once the cleanup of its attempt had given up (%d connections, all closed)", took.Round(time.Millisecond), len(conns))
	}
	// Close waits for the cleanup, which ends once the server is gone.
	closed := make(chan struct{})
	go func() {
		f.Close()
		close(closed)
	}()
	srv.kill()
	<-closed
	if c := pending(); c != nil {
		t.Fatal("Close returned while the cleanup still had its connection open")
	}
}
