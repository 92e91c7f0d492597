// Command 08-migration-runner is use case 8: a schema migration must run
// exactly once when the service starts, though every replica runs the
// migration step at boot, several at the same moment, others minutes
// later; and a replica that crashes mid-migration must not leave it half
// done or locked.
//
// Every replica calls lock.RunOnce with a Locker built WithWait.
// Underneath, RunOnce checks the ledger (a replica booting after the
// migration finished returns at once, without touching the lock), acquires
// the migration's lock — waiting, so replicas booting together queue behind
// the one that migrates and none serves before the schema is there —
// checks the ledger again under the lock (the migration finished while it
// waited: it returns), runs the migration with a context cancelled if the
// lock is lost, records it, and releases.
//
// The ledger here is the migration tool's own version table, which the
// migration writes in the same transaction as its DDL: a migration that
// committed is recorded, and one that crashed is not, so "once" holds even
// when a replica dies between the migration and RunOnce's own record (its
// MarkDone has nothing left to do). With -backend=postgres (the scenario's
// backend) the locks are pglock advisory locks on the same Postgres, the
// migrations real DDL in a schema of the run, and a replica's crash ends
// its sessions: Postgres frees its lock and rolls back its transaction.
// With no infrastructure the locks are filelock markers and the database
// a small in-memory one with the same rules.
//
//	go run ./08-migration-runner
//	go run ./08-migration-runner -backend=postgres
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/examples/internal/replica"
)

// Database is the service's database, as its migration tool sees it.
type Database interface {
	// Migrate applies version and records it in the version table, in one
	// transaction. Applying a version twice fails, as a CREATE TABLE does.
	// mid, if set, runs inside the transaction after the DDL.
	Migrate(ctx context.Context, version string, mid func(ctx context.Context) error) error
	// Applied reports whether version is in the version table.
	Applied(ctx context.Context, version string) (bool, error)
}

// versions is the ledger RunOnce reads: the version table, under keys
// "schema-migration:<version>" (which also name the migration's lock). Its
// MarkDone records nothing because the migration recorded itself.
type versions struct{ db Database }

const keyPrefix = "schema-migration:"

func (v versions) IsDone(ctx context.Context, key string) (bool, error) {
	return v.db.Applied(ctx, strings.TrimPrefix(key, keyPrefix))
}

func (v versions) MarkDone(ctx context.Context, key string, token uint64) error { return nil }

// RunMigrations is every replica's boot step: when it returns without
// error, version is applied, by this replica or another. locks must wait
// (WithWait).
func RunMigrations(ctx context.Context, locks lock.Locker, db Database, version string,
	mid func(ctx context.Context) error) (ran bool, err error) {
	return lock.RunOnce(ctx, locks, versions{db}, keyPrefix+version, func(ctx context.Context) error {
		slog.Info("running migration", "version", version)
		return db.Migrate(ctx, version, mid)
	})
}

// boot is one replica's boot, as the demo saw it.
type boot struct {
	Replica string
	Version string
	Ran     bool
	Err     error
	Ready   bool // the version was applied when RunMigrations returned
	Crashed bool // the replica crashed during its boot step
}

// result is every boot, and how often each migration started.
type result struct {
	Boots   []boot
	Started map[string]int
}

func run(ctx context.Context, c *replica.Cluster) (res result, err error) {
	db, cleanup, err := openDatabase(ctx, c)
	if err != nil {
		return res, err
	}
	defer cleanup()
	res.Started = map[string]int{}
	var mu sync.Mutex
	var n atomic.Int32
	start := func(version string, mid func(ctx context.Context) error) (*replica.Replica, func() boot, error) {
		name := fmt.Sprintf("replica-%d", n.Add(1))
		r, err := c.Replica(ctx, lock.WithOwner(name))
		if err != nil {
			return nil, nil, err
		}
		counted := func(ctx context.Context) error {
			mu.Lock()
			res.Started[version]++
			mu.Unlock()
			fmt.Printf("%s: migrating to %s\n", name, version)
			if mid != nil {
				return mid(ctx)
			}
			return nil
		}
		done := make(chan boot, 1)
		go func() {
			ran, err := RunMigrations(ctx, r.Locker(lock.WithWait()), db, version, counted)
			b := boot{Replica: name, Version: version, Ran: ran, Err: err}
			b.Ready, _ = db.Applied(ctx, version)
			fmt.Printf("%s: boot step done (ran %v, schema %s ready %v, err %v)\n", name, ran, version, b.Ready, err)
			done <- b
		}()
		return r, func() boot {
			b := <-done
			mu.Lock()
			res.Boots = append(res.Boots, b)
			mu.Unlock()
			return b
		}, nil
	}

	// 1. Three replicas boot at once.
	var waits []func() boot
	for range 3 {
		_, wait, err := start("v7", nil)
		if err != nil {
			return res, err
		}
		waits = append(waits, wait)
	}
	for _, w := range waits {
		w()
	}
	// 2. A replica boots later (a scale-up, a restart).
	_, wait, err := start("v7", nil)
	if err != nil {
		return res, err
	}
	wait()

	// 3. Release v8: the first replica crashes in the middle of the
	// migration, while two others wait for it.
	inside := make(chan struct{})
	crashing, waitCrashed, err := start("v8", func(ctx context.Context) error {
		close(inside)
		<-ctx.Done() // hung until its lock goes: it crashed
		return context.Cause(ctx)
	})
	if err != nil {
		return res, err
	}
	select {
	case <-inside:
	case <-ctx.Done():
		return res, fmt.Errorf("the v8 migrator never started: %w", ctx.Err())
	}
	waits = waits[:0]
	for range 2 {
		_, wait, err := start("v8", nil)
		if err != nil {
			return res, err
		}
		waits = append(waits, wait)
	}
	fmt.Println("the replica migrating to v8 crashes")
	crashing.Crash()
	waitCrashed()
	res.Boots[len(res.Boots)-1].Crashed = true
	for _, w := range waits {
		w()
	}
	return res, nil
}

// openDatabase returns the run's database and a function that removes it.
func openDatabase(ctx context.Context, c *replica.Cluster) (Database, func(), error) {
	if c.Backend != replica.Postgres {
		return &memDB{applied: map[string]bool{}}, func() {}, nil
	}
	r, err := c.Replica(ctx)
	if err != nil {
		return nil, nil, err
	}
	var id [4]byte
	rand.Read(id[:])
	db := &pgDB{pool: r.Postgres, schema: "example08_" + hex.EncodeToString(id[:])}
	if _, err := db.pool.Exec(ctx, `CREATE SCHEMA `+db.schema+`;
		CREATE TABLE `+db.schema+`.schema_migrations (version text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return nil, nil, err
	}
	return db, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		db.pool.Exec(ctx, `DROP SCHEMA `+db.schema+` CASCADE`)
	}, nil
}

// pgDB is the service's Postgres database.
type pgDB struct {
	pool   *pgxpool.Pool
	schema string
}

var ddl = map[string]string{
	"v7": `CREATE TABLE %s.orders (id bigint PRIMARY KEY, total numeric NOT NULL)`,
	"v8": `ALTER TABLE %s.orders ADD COLUMN currency text NOT NULL DEFAULT 'EUR'`,
}

func (db *pgDB) Migrate(ctx context.Context, version string, mid func(ctx context.Context) error) error {
	return pgx.BeginFunc(ctx, db.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, fmt.Sprintf(ddl[version], db.schema)); err != nil {
			return err
		}
		if mid != nil {
			if err := mid(ctx); err != nil {
				return err
			}
		}
		_, err := tx.Exec(ctx, `INSERT INTO `+db.schema+`.schema_migrations (version) VALUES ($1)`, version)
		return err
	})
}

func (db *pgDB) Applied(ctx context.Context, version string) (bool, error) {
	var ok bool
	err := db.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+db.schema+`.schema_migrations WHERE version = $1)`, version).Scan(&ok)
	return ok, err
}

// memDB is an in-memory stand-in with the same rules: a transaction's
// effects appear at commit, and a version applied twice fails.
type memDB struct {
	mu      sync.Mutex
	applied map[string]bool
}

func (db *memDB) Migrate(ctx context.Context, version string, mid func(ctx context.Context) error) error {
	if mid != nil {
		if err := mid(ctx); err != nil {
			return err // rolled back: nothing applied
		}
	}
	db.mu.Lock()
	defer db.mu.Unlock()
	if db.applied[version] {
		return fmt.Errorf("migration %s: already applied (relation exists)", version)
	}
	db.applied[version] = true
	return nil
}

func (db *memDB) Applied(ctx context.Context, version string) (bool, error) {
	db.mu.Lock()
	defer db.mu.Unlock()
	return db.applied[version], ctx.Err()
}

func main() {
	replica.Main(demo, replica.Filelock, replica.Postgres)
}

func demo(ctx context.Context, c *replica.Cluster) error {
	res, err := run(ctx, c)
	if err != nil {
		return err
	}
	fmt.Printf("migrations started: %v\n", res.Started)
	for _, b := range res.Boots {
		if b.Err != nil && !errors.Is(b.Err, lock.ErrLockLost) {
			return fmt.Errorf("%s: %w", b.Replica, b.Err)
		}
	}
	return nil
}
