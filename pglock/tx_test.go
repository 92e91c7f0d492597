package pglock_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/ubgo/lock"
	"github.com/ubgo/lock/internal/testenv"
	"github.com/ubgo/lock/pglock"
)

// begin starts a transaction on pool, rolled back at the end of the test
// if still open.
func begin(t testing.TB, pool *pgxpool.Pool) pgx.Tx {
	t.Helper()
	tx, err := pool.Begin(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tx.Rollback(context.Background()) })
	return tx
}

// usable fails the test unless tx still runs statements.
func usable(t testing.TB, tx pgx.Tx) {
	t.Helper()
	var one int
	if err := tx.QueryRow(ctxT(t), "SELECT 1", pgx.QueryExecModeSimpleProtocol).Scan(&one); err != nil {
		t.Fatalf("the transaction is not usable: %v", err)
	}
}

// txWaiting returns once a backend waits in Postgres's queue of name's
// mutex key (a lock not granted).
func txWaiting(t testing.TB, direct *pgxpool.Pool, name string) {
	t.Helper()
	testenv.Eventually(t, 30*time.Second, "a transaction waiting for the name", func() bool {
		var n int
		if err := direct.QueryRow(ctxT(t), `SELECT count(*) FROM pg_locks l WHERE l.locktype = 'advisory' AND l.objsubid = 1
			AND NOT l.granted AND (l.classid::int8 << 32) | l.objid::int8 = public.pglock_key('m', '', $1)`, name).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n > 0
	})
}

// AcquireInTx through PgBouncer in transaction mode, the setup it is for:
// exclusion between two transactions, a waiter granted at the holder's
// COMMIT, a ROLLBACK that frees, tokens that increase.
func TestAcquireInTxThroughTransactionPooler(t *testing.T) {
	direct := newPool(t)
	pool := bouncerPool(t, "transaction")
	f := newFactory(t, pool)
	name := uniq(t)

	tx1 := begin(t, pool)
	h1, err := f.AcquireInTx(ctxT(t), tx1, name)
	if err != nil {
		t.Fatal(err)
	}
	if h1.Token() == 0 || h1.Name() != name {
		t.Fatalf("holder: token %d, name %q", h1.Token(), h1.Name())
	}
	if pids := heldBy(t, direct, name); len(pids) != 1 || uint32(pids[0]) != h1.BackendPID() {
		t.Fatalf("pg_locks shows the name held by %v; want the transaction's backend %d", pids, h1.BackendPID())
	}
	// Inspect (here on the real server) shows it, by its backend.
	info, err := newFactory(t, direct).Inspect(ctxT(t), name)
	if err != nil {
		t.Fatal(err)
	}
	if len(info.Holders) != 1 || info.Limit != 1 || info.Holders[0].Metadata["pg.pid"] != strconv.Itoa(int(h1.BackendPID())) {
		t.Fatalf("Inspect: %+v; want one holder, backend %d", info, h1.BackendPID())
	}

	// Another transaction is refused at once and stays usable.
	tx2 := begin(t, pool)
	if _, err := f.AcquireInTx(ctxT(t), tx2, name); !errors.Is(err, pglock.ErrLocked) {
		t.Fatalf("second transaction: %v; want ErrLocked", err)
	}
	usable(t, tx2)
	// So is a session lock of the name, in this factory and another.
	if _, err := f.Acquire(ctxT(t), name); !errors.Is(err, pglock.ErrLocked) && !errors.Is(err, pglock.ErrSessionChanged) {
		t.Fatalf("Acquire through the pooler: %v", err)
	}
	if _, err := newFactory(t, direct).Acquire(ctxT(t), name); !errors.Is(err, pglock.ErrLocked) {
		t.Fatalf("session Acquire while a transaction holds the name: %v; want ErrLocked", err)
	}

	// A waiter is granted at the holder's COMMIT, with a larger token.
	type result struct {
		h   *pglock.TxHolder
		err error
	}
	got := make(chan result, 1)
	go func() {
		h, err := f.AcquireInTx(ctxT(t), tx2, name, pglock.WithWait())
		got <- result{h, err}
	}()
	txWaiting(t, direct, name)
	select {
	case r := <-got:
		t.Fatalf("the waiter returned while the name was held: %v", r.err)
	default:
	}
	if err := tx1.Commit(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	r := <-got
	if r.err != nil {
		t.Fatalf("waiter: %v", r.err)
	}
	if r.h.Token() <= h1.Token() {
		t.Fatalf("token %d after %d; want larger", r.h.Token(), h1.Token())
	}
	usable(t, tx2)

	// ROLLBACK frees it, for a session lock too.
	if err := tx2.Rollback(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	sh, err := newFactory(t, direct).Acquire(ctxT(t), name)
	if err != nil {
		t.Fatalf("session Acquire after the rollback: %v", err)
	}
	if sh.Token() <= r.h.Token() {
		t.Fatalf("session token %d after transaction token %d; want larger", sh.Token(), r.h.Token())
	}
	// And a session holder excludes transactions.
	tx3 := begin(t, pool)
	if _, err := f.AcquireInTx(ctxT(t), tx3, name); !errors.Is(err, pglock.ErrLocked) {
		t.Fatalf("AcquireInTx while a session holds the name: %v; want ErrLocked", err)
	}
	if err := sh.Release(); err != nil {
		t.Fatal(err)
	}
	h3, err := f.AcquireInTx(ctxT(t), tx3, name)
	if err != nil {
		t.Fatal(err)
	}
	if h3.Token() <= sh.Token() {
		t.Fatalf("token %d after %d; want larger", h3.Token(), sh.Token())
	}
	tx3.Commit(ctxT(t))
	if n := advisoryKeysHeld(t, direct, name); n != 0 {
		t.Fatalf("the server holds %d advisory locks of the name after the transactions ended", n)
	}
}

// A wait that ctx ends is cancelled on the server: the error matches the
// ctx's and ErrLocked, the transaction is aborted (and can be rolled
// back), and it waits no more; WithWaitTimeout is the same with a deadline.
func TestAcquireInTxWaitEnds(t *testing.T) {
	direct := newPool(t)
	pool := bouncerPool(t, "transaction")
	f := newFactory(t, pool)
	name := uniq(t)
	holder := begin(t, pool)
	if _, err := f.AcquireInTx(ctxT(t), holder, name); err != nil {
		t.Fatal(err)
	}

	tx := begin(t, pool)
	ctx, cancel := context.WithCancel(ctxT(t))
	done := make(chan error, 1)
	go func() {
		_, err := f.AcquireInTx(ctx, tx, name, pglock.WithWait())
		done <- err
	}()
	txWaiting(t, direct, name)
	cancel()
	err := <-done
	if !errors.Is(err, context.Canceled) || !errors.Is(err, lock.ErrLocked) {
		t.Fatalf("cancelled wait: %v; want an error matching context.Canceled and ErrLocked", err)
	}
	var pgErr *pgconn.PgError
	if _, err := tx.Exec(ctxT(t), "SELECT 1", pgx.QueryExecModeSimpleProtocol); !errors.As(err, &pgErr) || pgErr.Code != "25P02" {
		t.Fatalf("statement after the cancelled wait: %v; want 25P02 (transaction aborted)", err)
	}
	if err := tx.Rollback(ctxT(t)); err != nil {
		t.Fatalf("rollback after the cancelled wait: %v", err)
	}

	tx2 := begin(t, pool)
	_, err = f.AcquireInTx(ctxT(t), tx2, name, pglock.WithWaitTimeout(50*time.Millisecond))
	if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, lock.ErrLocked) {
		t.Fatalf("wait timeout: %v; want an error matching context.DeadlineExceeded and ErrLocked", err)
	}
	tx2.Rollback(ctxT(t))
	// Nobody waits any more; only the holder holds it.
	var waiting int
	if err := direct.QueryRow(ctxT(t), `SELECT count(*) FROM pg_locks l WHERE l.locktype = 'advisory' AND NOT l.granted
		AND (l.classid::int8 << 32) | l.objid::int8 = public.pglock_key('m', '', $1)`, name).Scan(&waiting); err != nil {
		t.Fatal(err)
	}
	if waiting != 0 {
		t.Fatalf("%d backends still wait for the name", waiting)
	}
	if pids := heldBy(t, direct, name); len(pids) != 1 {
		t.Fatalf("held by %v; want the holder's transaction alone", pids)
	}
}

// Bad input and a name held as a semaphore.
func TestAcquireInTxRefusals(t *testing.T) {
	direct := newPool(t)
	f := newFactory(t, direct)
	name := uniq(t)
	if _, err := f.AcquireInTx(ctxT(t), nil, name); !errors.Is(err, lock.ErrInvalidOption) {
		t.Fatalf("nil tx: %v; want ErrInvalidOption", err)
	}
	tx := begin(t, direct)
	if _, err := f.AcquireInTx(ctxT(t), tx, name, pglock.WithMaxConcurrent(2)); !errors.Is(err, lock.ErrInvalidOption) {
		t.Fatalf("WithMaxConcurrent(2): %v; want ErrInvalidOption", err)
	}
	if _, err := f.AcquireInTx(ctxT(t), tx, ""); !errors.Is(err, lock.ErrInvalidName) {
		t.Fatalf("empty name: %v; want ErrInvalidName", err)
	}
	sem, err := newFactory(t, direct).Acquire(ctxT(t), name, pglock.WithMaxConcurrent(2))
	if err != nil {
		t.Fatal(err)
	}
	defer sem.Release()
	if _, err := f.AcquireInTx(ctxT(t), tx, name); !errors.Is(err, lock.ErrLimitMismatch) {
		t.Fatalf("name held as a semaphore: %v; want ErrLimitMismatch", err)
	}
	usable(t, tx)
}
