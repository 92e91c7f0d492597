package pglock_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/ubgo/lock/internal/testenv"
	"github.com/ubgo/lock/pglock"
)

// Scenario 2 of the use cases: a cron job that fires on every replica and
// must run on one.
type Service struct {
	locks *pglock.Factory
}

func New(pool *pgxpool.Pool) *Service {
	return &Service{locks: pglock.NewFactory(pool)}
}

func (s *Service) HourlyAggregate(ctx context.Context) error {
	err := s.locks.WithLock(ctx, "hourly-aggregate", func(ctx context.Context) error {
		return aggregate(ctx)
	})
	if errors.Is(err, pglock.ErrLocked) {
		log.Println("aggregate already running on another replica")
		return nil
	}
	return err
}

func aggregate(ctx context.Context) error { return nil }

// Scenario 8 of the use cases: migrations guarded so that one replica runs
// them; the others get ErrLocked.
func RunMigrations(ctx context.Context, pool *pgxpool.Pool) error {
	locks := pglock.NewFactory(pool)
	defer locks.Close()

	return locks.WithLock(ctx, "schema-migrations", func(ctx context.Context) error {
		slog.Info("running migrations")
		return migrateRun(ctx, pool)
	})
}

func migrateRun(ctx context.Context, pool *pgxpool.Pool) error { return nil }

func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://postgres@127.0.0.1:5432/test")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	svc := New(pool)
	defer svc.locks.Close()
	if err := svc.HourlyAggregate(ctx); err != nil {
		log.Fatal(err)
	}
	if err := RunMigrations(ctx, pool); errors.Is(err, pglock.ErrLocked) {
		log.Println("another replica migrates")
	}
}

// A semaphore of three permits, each with its own fencing token.
func ExampleFactory_Acquire() {
	ctx := context.Background()
	pool, _ := pgxpool.New(ctx, "postgres://postgres@127.0.0.1:5432/test")
	locks := pglock.NewFactory(pool, pglock.WithKeyPrefix("indexer"))
	defer locks.Close()

	h, err := locks.Acquire(ctx, "batch", pglock.WithMaxConcurrent(3), pglock.WithWait())
	if err != nil {
		log.Fatal(err)
	}
	defer h.Release()
	fmt.Println("permit", h.Token(), "held by backend", h.BackendPID())
}

// A migration that holds its lock in its own transaction: taken inside
// it, released by its COMMIT (or ROLLBACK), so it also works where the
// only way to Postgres is a transaction-mode pooler such as PgBouncer with
// pool_mode=transaction.
func ExampleFactory_AcquireInTx() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, testenv.PostgresDSN()) // your database
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	locks := pglock.NewFactory(pool)
	defer locks.Close()

	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		h, err := locks.AcquireInTx(ctx, tx, "schema-migrations", pglock.WithWait())
		if err != nil {
			return err
		}
		fmt.Println("migrating under", h.Name(), "with a token:", h.Token() > 0)
		_, err = tx.Exec(ctx, "CREATE TEMPORARY TABLE pglock_example (id int) ON COMMIT DROP")
		return err
	}) // the COMMIT releases the lock
	if err != nil {
		log.Fatal(err)
	}
}

// An administrator can create pglock's objects ahead of time for a role
// that may not create them.
func ExampleSetupSQL() {
	sql := pglock.SetupSQL("locks")
	fmt.Println(strings.Contains(sql, `CREATE TABLE IF NOT EXISTS "locks".pglock_limits`))
	// Output: true
}
