package bench

import (
	"context"
	"net"
	"sync/atomic"

	"google.golang.org/grpc"
)

// Round trips are counted where they happen. A Redis or Postgres client
// speaks in turns on each connection (it writes a request, then reads the
// reply), so a write that follows a read, or the first one, starts a round
// trip; a pipeline or a batch sent in one go counts once. etcd's client
// multiplexes requests on one HTTP/2 connection, so there each unary RPC
// is a round trip.
type rtCounter struct{ n atomic.Int64 }

func (c *rtCounter) load() int64 {
	if c == nil {
		return 0
	}
	return c.n.Load()
}

// dial wraps a dialer so that its connections count turns into c.
func (c *rtCounter) dial(dial func(ctx context.Context, network, addr string) (net.Conn, error)) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &turnConn{Conn: conn, c: c}, nil
	}
}

type turnConn struct {
	net.Conn
	c     *rtCounter
	wrote atomic.Bool // since the last read
}

func (t *turnConn) Write(b []byte) (int, error) {
	if !t.wrote.Swap(true) {
		t.c.n.Add(1)
	}
	return t.Conn.Write(b)
}

func (t *turnConn) Read(b []byte) (int, error) {
	n, err := t.Conn.Read(b)
	if n > 0 {
		t.wrote.Store(false)
	}
	return n, err
}

// unary counts etcd's unary RPCs into c.
func (c *rtCounter) unary() grpc.DialOption {
	return grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		c.n.Add(1)
		return invoker(ctx, method, req, reply, cc, opts...)
	})
}
