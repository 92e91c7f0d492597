package pglock

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// ErrNoAdvisoryLocks: the server speaks the PostgreSQL protocol but its
// advisory lock functions do not lock (CockroachDB's return true to every
// caller), so pglock refuses it rather than hand out locks that exclude
// nobody.
var ErrNoAdvisoryLocks = errors.New("pglock: the server's advisory locks do not lock; pglock needs PostgreSQL")

// checkVersion refuses a server by what it calls itself: version(), or
// the crdb_version parameter CockroachDB reports at connect.
func checkVersion(version string) error {
	if strings.Contains(version, "CockroachDB") {
		return fmt.Errorf("%w (the server is %q: its pg_advisory_lock functions succeed for every session)", ErrNoAdvisoryLocks, version)
	}
	return nil
}

// refusal is the error a server that cannot hold session locks was
// refused with (see setup), which every later Acquire returns without
// opening a connection; nil if none.
func (f *Factory) refusal() error {
	f.setupMu.Lock()
	defer f.setupMu.Unlock()
	return f.refused
}

// refuse makes err, a sign of a transaction-mode pooler seen after
// checkPooler missed it, the answer to every later Acquire.
func (f *Factory) refuse(err error) {
	f.setupMu.Lock()
	defer f.setupMu.Unlock()
	if f.refused == nil {
		f.refused = err
	}
}

// pooled reports whether err is a statement of a lock session failing on a
// prepared statement that its own connection never had (26000) or had not
// yet made (42P05): the statement reached a backend another client used,
// as behind a transaction-mode pooler.
func pooled(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "42P05" || pgErr.Code == "26000")
}

// poolerRounds is how many times checkPooler looks: behind a busy pooler
// each look may miss, and few miss three times in a row.
const poolerRounds = 3

// checkPooler refuses a connection that does not keep its backend between
// transactions, as behind PgBouncer in pool_mode=transaction, before any
// lock is taken on it: c, the factory's first lock session, has just
// answered from backend pid, in a transaction of its own. Another pool
// connection starts a transaction, so that it keeps a backend, and asks
// for its pid; c asks for its own; the other ends its transaction; c asks
// again. On session-mode connections the other's backend is never c's,
// and c's never changes. A transaction pooler hands an idle server
// connection to the next transaction (PgBouncer: the one released last,
// by default): the other gets the one c just used, or c gets another while
// the other holds its own, or c then gets the one the other just released.
// It can miss, poolerRounds times in a row, when other clients of a busy
// pooler take and release server connections in between so that each
// gets its old one back; the check every lock session makes at each
// statement (see checkPID) is then the guard left. Every statement is in
// the simple protocol, which a transaction pooler passes: 4 × poolerRounds
// round trips, once per factory.
func (f *Factory) checkPooler(ctx context.Context, c *pgx.Conn, pid int32) error {
	pc, err := f.poolConn(ctx, "acquire: checking for a transaction-mode pooler")
	if err != nil {
		return err
	}
	defer pc.Release() // a connection left in a transaction is closed by the pool
	oc := pc.Conn().PgConn()
	fail := func(err error) error {
		return fmt.Errorf("pglock: acquire: checking for a transaction-mode pooler: %w", err)
	}
	mine := func() (int32, error) {
		var p int32
		err := c.QueryRow(ctx, "SELECT pg_backend_pid()", pgx.QueryExecModeSimpleProtocol).Scan(&p)
		return p, err
	}
	for range poolerRounds {
		res, err := oc.Exec(ctx, "BEGIN; SELECT pg_backend_pid()").ReadAll()
		if err == nil && (len(res) != 2 || len(res[1].Rows) != 1 || len(res[1].Rows[0]) != 1) {
			err = errors.New("unexpected reply")
		}
		var other int64
		if err == nil {
			other, err = strconv.ParseInt(string(res[1].Rows[0][0]), 10, 32)
		}
		if err != nil {
			return fail(err)
		}
		during, err := mine()
		if err != nil {
			return fail(err)
		}
		if _, err := oc.Exec(ctx, "ROLLBACK").ReadAll(); err != nil {
			return fail(err)
		}
		after, err := mine()
		if err != nil {
			return fail(err)
		}
		if int32(other) == pid || during != pid || after != pid {
			return fmt.Errorf("%w: refused before any lock was taken: the connection's backend changed between transactions (%d, then %d and %d; another connection got %d), as behind PgBouncer's pool_mode=transaction; use a session-mode pool, or AcquireInTx", ErrSessionChanged, pid, during, after, other)
		}
	}
	return nil
}
