// Package exampletest is what the examples' tests share: a cluster on a
// backend, skipped (or failed under CI=true) when its service is absent.
package exampletest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ubgo/lock/examples/internal/replica"
	"github.com/ubgo/lock/internal/testenv"
)

// Bound is the generous deadline of one scenario run: the machine is
// small and noisy, and no test asserts on speed.
const Bound = 30 * time.Second

// Context returns a context that ends after Bound or with the test.
func Context(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), Bound)
	t.Cleanup(cancel)
	return ctx
}

// Open returns a cluster on backend, closed when the test ends. File
// backends get a directory of the test's own. A network backend whose
// service cannot be reached skips the test, or fails it where services are
// required (testenv.Unavailable).
func Open(t testing.TB, backend string) *replica.Cluster {
	t.Helper()
	dir := ""
	if s := replica.Service(backend); s == "" {
		dir = t.TempDir()
	} else {
		testenv.SkipShort(t, s)
	}
	c, err := replica.Open(Context(t), backend, dir)
	if errors.Is(err, replica.ErrUnavailable) {
		testenv.Unavailable(t, replica.Service(backend), err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("closing the cluster: %v", err)
		}
	})
	return c
}

// ForEach runs fn as a subtest on each backend, in parallel.
func ForEach(t *testing.T, backends []string, fn func(t *testing.T, c *replica.Cluster)) {
	for _, b := range backends {
		t.Run(b, func(t *testing.T) {
			t.Parallel()
			fn(t, Open(t, b))
		})
	}
}
