package pglock_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/ubgo/lock/internal/testenv"
)

// newPool connects to the test server, or ends the test the way testenv
// says when it cannot.
func newPool(t testing.TB, configure ...func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(testenv.PostgresDSN())
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range configure {
		c(cfg)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	testenv.Need(t, "postgres", pool.Ping)
	return pool
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// terminate ends a backend the way an operator or a failover would.
func terminate(t testing.TB, pool *pgxpool.Pool, pid uint32) {
	t.Helper()
	var ok bool
	if err := pool.QueryRow(context.Background(), "SELECT pg_terminate_backend($1)", int32(pid)).Scan(&ok); err != nil || !ok {
		t.Fatalf("pg_terminate_backend(%d) = %v, %v", pid, ok, err)
	}
}
