package pglock

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/ubgo/lock"
	"github.com/ubgo/lock/backend"
)

// TxHolder is a lock taken by AcquireInTx: held by its transaction until
// the transaction ends. It has no Release: Postgres gives a transaction
// lock back only when the transaction commits or rolls back, so ending the
// transaction is the release, and a Release that did nothing would let a
// caller believe the lock was gone while it is still held.
type TxHolder struct {
	name  string
	token uint64
	pid   uint32
}

// Token is the fencing token, from the same counter, and so in the same
// order, as the tokens of the factory's Acquire: strictly increasing per
// name, taken in the statement that took the lock.
func (h *TxHolder) Token() uint64 { return h.token }

// Name is the name the lock was acquired under.
func (h *TxHolder) Name() string { return h.name }

// BackendPID is the pid of the Postgres backend running the transaction,
// which holds the lock, as pg_locks and pg_stat_activity show it.
func (h *TxHolder) BackendPID() uint32 { return h.pid }

// AcquireInTx takes the mutex name inside tx, as a transaction lock
// (pg_try_advisory_xact_lock, or pg_advisory_xact_lock with WithWait) with
// its fencing token from the same statement: it is held until tx commits
// or rolls back, and then freed by Postgres, however the transaction ends.
// It works where session locks cannot: behind a transaction-mode pooler
// (PgBouncer pool_mode=transaction), where tx keeps one server connection
// from BEGIN to its end. The lock excludes, and is excluded by, the
// factory's Acquire of the same name and prefix in any process. tx must be
// on the database of the factory's pool; the first call sets up pglock's
// objects through the pool if they are missing, as Acquire does.
//
// On contention it returns an error matching ErrLocked at once; tx is
// still usable. With WithWait (or WithWaitTimeout) it waits in Postgres's
// queue of the name until it is granted or ctx (or the wait timeout)
// ends. ctx ending during the statement cancels it on the server: the
// error then matches ctx.Err() (and ErrLocked, with WithWait) and tx is
// aborted (if the cancel cannot be sent, tx's connection is closed); a ctx
// that ended before the statement was sent leaves tx as it was. Either
// way, roll tx back. A grant that races the cancel is returned as a
// success, held like any other.
//
// The lock is re-entrant within tx, as Postgres's transaction locks are:
// a second AcquireInTx of the name in the same transaction succeeds too,
// with a larger token. WithMaxConcurrent above 1 is an invalid option
// (semaphore permits are session locks). WithOwner and WithMetadata are
// not recorded: a row written in tx would become visible only at the
// commit that ends the lock; Inspect shows the holder with its backend pid.
// Options that concern sessions or leases (WithTTL, WithAutoRenew and the
// factory options) do not apply. An error matching lock.ErrLimitMismatch
// (the name is held as a semaphore) leaves the mutex key held by tx until
// it ends. An observer (WithObserver) sees the acquire, not its end. tx
// must not be used by another goroutine during the call.
func (f *Factory) AcquireInTx(ctx context.Context, tx pgx.Tx, name string, opts ...Option) (*TxHolder, error) {
	start := time.Now()
	o, err := f.cfg.Resolve(name, opts, checkTx)
	if err == nil && tx == nil {
		err = fmt.Errorf("pglock: %w: nil pgx.Tx", lock.ErrInvalidOption)
	}
	r, err := backend.Take(ctx, backend.Call{Backend: backendName, Name: name, Locked: ErrLocked, Start: start, Probe: f.probe}, &o, err, func(ctx context.Context) (txTaken, time.Duration, error) {
		h, err := f.takeInTx(ctx, tx, name, &o)
		return txTaken{h}, 0, err
	})
	return r.TxHolder, err
}

// checkTx is checkCall, and a mutex only.
func checkTx(o *lock.Options) error {
	if o.Limit() > 1 {
		return fmt.Errorf("%w: WithMaxConcurrent(%d): AcquireInTx takes a mutex only", lock.ErrInvalidOption, o.MaxConcurrent)
	}
	return checkCall(o)
}

// txTaken is what backend.Take reports of an AcquireInTx: the token.
type txTaken struct{ *TxHolder }

func (t txTaken) Token() uint64       { return t.token }
func (txTaken) Release() error        { return nil }
func (txTaken) Done() <-chan struct{} { return nil }
func (txTaken) Err() error            { return nil }

var _ lock.Holder = txTaken{}

// takeInTx runs the acquire statement (tx_try.sql, tx_wait.sql) in tx. The
// statement runs without ctx's cancellation, which instead sends a cancel
// request, as a blocked waiter's does (see cancelOnEnd): pgx would close
// the connection. A try is bounded by the statement timeout the same way.
func (f *Factory) takeInTx(ctx context.Context, tx pgx.Tx, name string, o *lock.Options) (*TxHolder, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := f.txSetup(ctx); err != nil {
		return nil, err
	}
	k := keysOf(o.KeyPrefix, name)
	q, bound := f.st.txWait, ctx
	if !o.Wait {
		var cancel context.CancelFunc
		q = f.st.txTry
		bound, cancel = context.WithTimeout(ctx, f.set.stmtTimeout)
		defer cancel()
	}
	pc := tx.Conn().PgConn()
	returned := cancelOnEnd(bound, pc, func() { pc.Conn().Close() }, f.set.connectTimeout)
	var (
		tok int64
		pid int32
	)
	// QueryExecModeExec: an unnamed statement, whatever tx's connection
	// defaults to, so that nothing is prepared on a pooler's server
	// connection.
	err := tx.QueryRow(context.WithoutCancel(ctx), q, pgx.QueryExecModeExec, k.mutex, k.mark, f.st.counter).Scan(&tok, &pid)
	returned()
	switch {
	case err != nil && ctx.Err() != nil:
		return nil, fmt.Errorf("pglock: acquire in transaction: %w (the transaction is aborted)", ctx.Err())
	case err != nil && bound.Err() != nil:
		return nil, fmt.Errorf("pglock: acquire in transaction: no answer within %v (the transaction is aborted): %w", f.set.stmtTimeout, err)
	case err != nil:
		return nil, fmt.Errorf("pglock: acquire in transaction: %w", err)
	}
	if tok > 0 && !f.validToken(tok) {
		// Read, or move to, the epoch on the pool: a new one commits on its own.
		query := func(sql string, args ...any) pgx.Row {
			return f.pool.QueryRow(ctx, sql, append([]any{pgx.QueryExecModeSimpleProtocol}, args...)...)
		}
		if tok, err = f.freshToken(tok, query, func(int32) error { return nil }); err != nil {
			return nil, fmt.Errorf("%w (the transaction holds the lock until it ends)", err)
		}
	}
	switch {
	case tok > 0:
		return &TxHolder{name: name, token: uint64(tok), pid: uint32(pid)}, nil
	case tok == tryHeld:
		return nil, ErrLocked
	case tok == trySemaphore:
		return nil, fmt.Errorf("pglock: %w: %q is held as a semaphore, caller asked for a mutex (the transaction holds the mutex key until it ends)", lock.ErrLimitMismatch, name)
	}
	return nil, fmt.Errorf("pglock: unexpected acquire result %d", tok)
}

// txSetup checks the server and makes sure pglock's objects exist, through
// the pool, once per factory (unless a lock session did it). It does not
// check for a transaction-mode pooler: AcquireInTx works behind one.
func (f *Factory) txSetup(ctx context.Context) error {
	f.setupMu.Lock()
	defer f.setupMu.Unlock()
	switch {
	case errors.Is(f.refused, ErrNoAdvisoryLocks):
		return f.refused
	case f.setupDone || f.txReady:
		return nil
	}
	pc, err := f.poolConn(ctx, "acquire in transaction: setting up")
	if err != nil {
		return err
	}
	defer pc.Release()
	var version string
	err = checkVersion(pc.Conn().PgConn().ParameterStatus("crdb_version"))
	if err == nil {
		if err = pc.QueryRow(ctx, "SELECT version()", pgx.QueryExecModeSimpleProtocol).Scan(&version); err != nil {
			return fmt.Errorf("pglock: acquire in transaction: setting up: %w", err)
		}
		err = checkVersion(version)
	}
	if err != nil {
		f.refused = err
		return err
	}
	if err := ensureObjects(ctx, pc.Conn(), f.st); err != nil {
		return err
	}
	f.txReady = true
	return nil
}
