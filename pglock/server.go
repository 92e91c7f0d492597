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
// connection, in a transaction so that it keeps its backend, asks for its
// backend pid, and then c asks again. On session-mode connections the
// other's backend is never c's, and c's never changes. Behind a
// transaction pooler, which hands an idle server connection to the next
// transaction (PgBouncer: the one used last, by default), the other gets
// c's backend, or, when other clients took that one meanwhile, c gets
// another. It can miss, poolerRounds times in a row, when a busy pooler
// happens to give each its old backend back; the check every lock session
// makes at each statement (see checkPID) is then the guard left. Every
// statement is in the simple protocol, which a transaction pooler passes:
// 3 × poolerRounds round trips, once per factory. (The other connection's
// ROLLBACK is a message of its own: sent with the next BEGIN it would keep
// that connection on one backend for every round.)
func (f *Factory) checkPooler(ctx context.Context, c *pgx.Conn, pid int32) error {
	pc, err := f.poolConn(ctx, "checking for a transaction-mode pooler")
	if err != nil {
		return err
	}
	defer pc.Release() // a connection left in a transaction is closed by the pool
	oc := pc.Conn().PgConn()
	fail := func(err error) error { return fmt.Errorf("pglock: checking for a transaction-mode pooler: %w", err) }
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
		var again int32
		if err := c.QueryRow(ctx, "SELECT pg_backend_pid()", pgx.QueryExecModeSimpleProtocol).Scan(&again); err != nil {
			return fail(err)
		}
		if int32(other) == pid || again != pid {
			return fmt.Errorf("%w: refused before any lock was taken: the connection's backend changed between transactions (%d, then %d; another connection got %d), as behind PgBouncer's pool_mode=transaction; use a session-mode pool, or AcquireInTx", ErrSessionChanged, pid, again, other)
		}
		if _, err := oc.Exec(ctx, "ROLLBACK").ReadAll(); err != nil {
			return fail(err)
		}
	}
	return nil
}
