package redislock

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/ubgo/lock/backend"
	"github.com/ubgo/lock/internal/testenv"
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

// An acquire request delayed on its way to the server past the client's
// timeout runs only after the client gave the attempt up: after its
// cleanup (which ran on another connection and found nothing), or after
// go-redis retried it on another connection and the holder released the
// lock. Either way its id is held by nobody, and it must not take the name.
func TestDelayedAcquireTakesNothing(t *testing.T) {
	rdb := newClient(t)
	ctx := ctxT(t)
	for _, s := range []*redis.Script{mutexAcquire, semAcquire} {
		// So that the held EVALSHA runs the script when it is sent on.
		if err := s.Load(ctx, rdb).Err(); err != nil {
			t.Fatal(err)
		}
	}
	const ttl = 5 * time.Second
	for _, limit := range []int{1, 2} {
		for _, after := range []string{"cleanup", "release"} {
			t.Run(fmt.Sprintf("limit%d/%s", limit, after), func(t *testing.T) {
				p := startHoldProxy(t, testenv.RedisAddr(), isAcquire)
				opt := &redis.Options{Addr: p.addr()}
				if after == "cleanup" {
					// The attempt fails at the caller's deadline, and go-redis
					// does not retry it.
					opt.ContextTimeoutEnabled = true
				} else {
					// go-redis retries the attempt after a read timeout, on
					// another connection, with the same id.
					opt.ReadTimeout = 300 * time.Millisecond
				}
				pc := redis.NewClient(opt)
				defer pc.Close()
				f := NewFactory(pc, WithKeyPrefix(testPrefix), WithLogger(nil), WithTTL(ttl), WithMaxConcurrent(limit))
				name := uniq(t, "x")
				switch after {
				case "cleanup":
					actx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
					_, err := f.Acquire(actx, name)
					cancel()
					if !errors.Is(err, context.DeadlineExceeded) {
						t.Fatalf("Acquire = %v; want context.DeadlineExceeded", err)
					}
				case "release":
					h, err := f.Acquire(ctx, name)
					if err != nil {
						t.Fatalf("Acquire (retried by go-redis) = %v", err)
					}
					if err := h.Release(); err != nil {
						t.Fatal(err)
					}
				}
				await(t, p.held, time.Second, "acquire held by the proxy")
				f.Close() // waits for the cleanup
				close(p.release)
				await(t, p.sent, 10*time.Second, "delayed acquire answered")
				// The name is free: a newcomer gets it at once.
				g := testFactory(t, rdb, WithMaxConcurrent(limit))
				hs := make([]*Holder, 0, limit)
				for range limit {
					h, err := g.Acquire(ctx, name)
					if err != nil {
						k := keysFor(testPrefix, name)
						info, _ := g.Inspect(ctx, name)
						t.Fatalf("after the delayed acquire ran: %v; held by nobody: %+v (PTTL lock %v, permits %v of a %v TTL)",
							err, info, rdb.PTTL(ctx, k.lock).Val(), rdb.PTTL(ctx, k.permits).Val(), ttl)
					}
					hs = append(hs, h)
				}
				for _, h := range hs {
					h.Release()
				}
			})
		}
	}
}
