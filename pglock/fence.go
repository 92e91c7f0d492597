package pglock

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/ubgo/lock"
	"github.com/ubgo/lock/backend"
)

// Fence is a lock.Fence kept in a Postgres table, pglock_fences in the
// schema of WithSchema: one row per (prefix, key) with the highest accepted
// token as numeric(20,0), which holds every uint64. RejectIfStale is one
// statement (sql/fence_check.sql):
//
//	INSERT INTO pglock_fences AS t (ns, key, token) VALUES ($1, $2, $3)
//	ON CONFLICT (ns, key) DO UPDATE SET token = EXCLUDED.token, updated_at = now()
//	WHERE t.token <= EXCLUDED.token
//	-- no row: the token is stale
//
// RejectIfStaleTx runs the same statement in the caller's transaction, so
// that the check and the guarded writes commit together or not at all.
//
// The table is created on first use, unless it exists. A role that may not
// create it gets an error naming the SQL an administrator runs instead
// (StoreSetupSQL).
type Fence struct{ st *store }

// Ledger is a lock.Ledger kept in a Postgres table, pglock_ledger in the
// schema of WithSchema: one row per recorded (prefix, key) with the token
// that recorded it and the time. MarkDone is INSERT … ON CONFLICT DO
// NOTHING and IsDone is SELECT EXISTS, one statement each. An operator
// re-runs a key's work by deleting its row.
type Ledger struct{ st *store }

// NewFence returns a fence on pool. WithSchema (default DefaultSchema)
// names the schema of its table and WithKeyPrefix the namespace of its
// keys; the other options are accepted and ignored, so a factory's options
// can be passed as they are. A nil pool or an invalid option is reported by
// the first call. The fence does not close pool.
func NewFence(pool *pgxpool.Pool, opts ...Option) *Fence {
	return &Fence{st: newStore(pool, "pglock_fences", "fences_table", opts)}
}

// NewLedger returns a ledger on pool, configured like NewFence.
func NewLedger(pool *pgxpool.Pool, opts ...Option) *Ledger {
	return &Ledger{st: newStore(pool, "pglock_ledger", "ledger_table", opts)}
}

// StoreSetupSQL returns the SQL that creates the tables of Fence and
// Ledger in schema, for an administrator to run when the application's
// role may not create tables. That role then needs SELECT, INSERT and
// UPDATE on pglock_fences, and SELECT and INSERT on pglock_ledger.
func StoreSetupSQL(schema string) string {
	return inSchema("fences_table", schema) + inSchema("ledger_table", schema)
}

// store is the table of a Fence or Ledger and the statements on it.
type store struct {
	pool   *pgxpool.Pool
	err    error
	schema string
	table  string
	create string // the table's CREATE TABLE IF NOT EXISTS
	ns     string
	q      string // the table's quoted name, for messages

	// The statements of sql/ on it, in the schema.
	fenceCheck, fenceRead, ledgerIsDone, ledgerMarkDone string

	mu    sync.Mutex  // held by the one goroutine that looks for or creates the table
	ready atomic.Bool // the table is known to exist
}

func newStore(pool *pgxpool.Pool, table, create string, opts []Option) *store {
	o, err := lock.Apply(backend.Options(backendName), opts...)
	if err == nil {
		err = checkCall(&o)
	}
	if pool == nil {
		err = errors.Join(err, fmt.Errorf("pglock: %w: nil *pgxpool.Pool", lock.ErrInvalidOption))
	}
	schema := factorySettings(&o).schema
	return &store{pool: pool, err: err, schema: schema, table: table, create: inSchema(create, schema), ns: o.KeyPrefix,
		q:          pgx.Identifier{schema, table}.Sanitize(),
		fenceCheck: inSchema("fence_check", schema), fenceRead: inSchema("fence_read", schema),
		ledgerIsDone: inSchema("ledger_is_done", schema), ledgerMarkDone: inSchema("ledger_mark_done", schema),
	}
}

// check rejects what no statement should be sent for.
func (s *store) check(ctx context.Context, key string) error {
	return backend.CheckStore(ctx, s.err, key)
}

// ensure creates the table unless this store has seen it. Creators in
// several processes are serialised by a transaction-level advisory lock,
// as pglock's own objects are: two concurrent CREATE TABLE IF NOT EXISTS
// can otherwise both try to create it and one fail.
func (s *store) ensure(ctx context.Context) error {
	if s.ready.Load() {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ready.Load() {
		return nil
	}
	var exists bool
	if err := s.pool.QueryRow(ctx, inSchema("table_exists", s.schema), s.schema, s.table).Scan(&exists); err != nil {
		return fmt.Errorf("pglock: checking for table %s: %w", s.q, err)
	}
	if !exists {
		err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, advisoryKey("setup", "", s.schema+"."+s.table, -1)); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, s.create)
			return err
		})
		if err != nil {
			var pgErr *pgconn.PgError
			if errors.As(err, &pgErr) && (pgErr.Code == "42501" || pgErr.Code == "3F000") {
				return fmt.Errorf("pglock: cannot create table %s (%w); grant CREATE on the schema, choose another with WithSchema, or have an administrator run pglock.StoreSetupSQL(%q) beforehand", s.q, err, s.schema)
			}
			return fmt.Errorf("pglock: creating table %s: %w", s.q, err)
		}
	}
	s.ready.Store(true)
	return nil
}

// run runs do once the table exists, and once more after creating it again
// if it was dropped since this store last saw it.
func (s *store) run(ctx context.Context, do func() error) error {
	for attempt := 0; ; attempt++ {
		if err := s.ensure(ctx); err != nil {
			return err
		}
		err := do()
		if isUndefined(err) {
			s.ready.Store(false) // dropped since: create it again
			if attempt == 0 {
				continue
			}
		}
		return s.wrap(err)
	}
}

func (s *store) wrap(err error) error {
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &pgErr) && pgErr.Code == "42501":
		rights := "SELECT and INSERT"
		if s.table == "pglock_fences" {
			rights = "SELECT, INSERT and UPDATE"
		}
		return fmt.Errorf("pglock: the role may not use table %s (%w); grant it %s on the table", s.q, err, rights)
	}
	return fmt.Errorf("pglock: %s: %w", s.table, err)
}

// RejectIfStale records token as the highest for key, or returns an error
// matching lock.ErrStaleToken, recording nothing, if a higher token is
// recorded or token is 0. It commits at once; to make the check part of
// your own writes, use RejectIfStaleTx.
func (f *Fence) RejectIfStale(ctx context.Context, key string, token uint64) error {
	if err := f.st.check(ctx, key); err != nil {
		return err
	}
	if token == 0 {
		return staleZero(key)
	}
	var ok bool
	err := f.st.run(ctx, func() error {
		return f.st.pool.QueryRow(ctx, f.st.fenceCheck, f.st.ns, key, strconv.FormatUint(token, 10)).Scan(&ok)
	})
	return f.result(ctx, f.st.pool, key, token, err)
}

// RejectIfStaleTx is RejectIfStale inside tx, the transaction that makes
// the guarded writes: the upsert takes the fence row's lock until tx ends,
// so a writer with another token waits for tx and then sees its outcome,
// and the check and the writes commit together or not at all. On an error
// matching lock.ErrStaleToken tx is still usable, and should be rolled
// back. tx must be on the database of the fence's pool; the table is
// created, if missing, through the pool before the statement runs in tx. At
// REPEATABLE READ or SERIALIZABLE, a concurrent writer of the same key makes
// the statement fail with a serialization error: retry the transaction.
func (f *Fence) RejectIfStaleTx(ctx context.Context, tx pgx.Tx, key string, token uint64) error {
	if err := f.st.check(ctx, key); err != nil {
		return err
	}
	if tx == nil {
		return fmt.Errorf("pglock: %w: nil pgx.Tx", lock.ErrInvalidOption)
	}
	if token == 0 {
		return staleZero(key)
	}
	if err := f.st.ensure(ctx); err != nil {
		return err
	}
	var ok bool
	err := tx.QueryRow(ctx, f.st.fenceCheck, f.st.ns, key, strconv.FormatUint(token, 10)).Scan(&ok)
	if isUndefined(err) {
		f.st.ready.Store(false) // dropped since: the next call creates it again
	}
	return f.result(ctx, tx, key, token, f.st.wrap(err))
}

type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// result turns the upsert's outcome into RejectIfStale's. No row is a stale
// token; the recorded one is read afterwards for the message only.
func (f *Fence) result(ctx context.Context, q querier, key string, token uint64, err error) error {
	if !errors.Is(err, pgx.ErrNoRows) {
		return err
	}
	cur := "a higher token"
	var v string
	if q.QueryRow(ctx, f.st.fenceRead, f.st.ns, key).Scan(&v) == nil {
		cur = v
	}
	return fmt.Errorf("pglock: %w: %q: token %d is below %s", lock.ErrStaleToken, key, token, cur)
}

func staleZero(key string) error {
	return fmt.Errorf("pglock: %w: %q: token 0 is never issued to a holder", lock.ErrStaleToken, key)
}

// IsDone reports whether key is recorded.
func (l *Ledger) IsDone(ctx context.Context, key string) (bool, error) {
	if err := l.st.check(ctx, key); err != nil {
		return false, err
	}
	var done bool
	err := l.st.run(ctx, func() error {
		return l.st.pool.QueryRow(ctx, l.st.ledgerIsDone, l.st.ns, key).Scan(&done)
	})
	return done && err == nil, err
}

// MarkDone records key as done by token, unless it already is: the first
// record wins and a repeated call changes nothing.
func (l *Ledger) MarkDone(ctx context.Context, key string, token uint64) error {
	if err := l.st.check(ctx, key); err != nil {
		return err
	}
	return l.st.run(ctx, func() error {
		_, err := l.st.pool.Exec(ctx, l.st.ledgerMarkDone, l.st.ns, key, strconv.FormatUint(token, 10))
		return err
	})
}
