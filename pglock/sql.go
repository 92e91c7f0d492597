package pglock

import (
	"context"
	"crypto/sha256"
	"embed"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// The statements are the files of sql/, one statement each, whose header
// says its parameters and result. Every object of pglock is written there
// as :"schema".name, which psql fills in from -v schema=...; so a statement
// runs by hand with
//
//	{ echo 'PREPARE s AS'; cat sql/mutex_try.sql; echo '; EXECUTE s(...);'; } | psql -v schema=public
//
// (or with \bind on psql 16 and later), and setup.sql with
// psql -v schema=public -1 -f sql/setup.sql.
//
//go:embed sql/*.sql
var sqlFiles embed.FS

// inSchema puts schema into a statement of sql/: its :"schema" becomes the
// schema's quoted identifier, as psql makes it. It is the one change made
// to the text of any statement.
func inSchema(name, schema string) string {
	b, err := sqlFiles.ReadFile("sql/" + name + ".sql")
	if err != nil {
		panic("pglock: " + err.Error()) // a file missing from the build
	}
	return strings.ReplaceAll(string(b), `:"schema"`, pgx.Identifier{schema}.Sanitize())
}

// statements are the statements of sql/ in one schema, by name.
type statements struct {
	schema  string
	counter string // the token counter, a parameter of the statements that take a token

	objectsExist, sessionOpen, sessionSweep, health, waitSession string

	// Taking and releasing a name, without a holder row and with one (for
	// a call with an owner or metadata, which Inspect and List show).
	mutexTry, mutexTryRow, mutexWait, mutexWaitRow           string
	sharedTry, sharedTryRow, sharedJoin, sharedJoinRow       string
	sharedWait, sharedWaitRow, sharedMarker, sharedMarkerRow string
	mutexRelease, mutexReleaseRow                            string
	sharedRelease, sharedReleaseRow                          string
	semAcquire, semRelease, relimit                          string
	abandon                                                  string
	epoch, rebase, token, retoken                            string
	waiterMark, waiterUnmark                                 string
	intentTake, intentDrop                                   string
	txTry, txWait                                            string
	inspectLimit, inspect, list                              string
}

func newStatements(schema string) *statements {
	in := func(name string) string { return inSchema(name, schema) }
	return &statements{
		schema:  schema,
		counter: pgx.Identifier{schema, "pglock_token_counter"}.Sanitize(),

		objectsExist: in("objects_exist"), sessionOpen: in("session_open"), sessionSweep: in("session_sweep"),
		health: in("health"), waitSession: in("wait_session"),

		mutexTry: in("mutex_try"), mutexTryRow: in("mutex_try_row"), mutexWait: in("mutex_wait"), mutexWaitRow: in("mutex_wait_row"),
		sharedTry: in("shared_try"), sharedTryRow: in("shared_try_row"), sharedJoin: in("shared_join"), sharedJoinRow: in("shared_join_row"),
		sharedWait: in("shared_wait"), sharedWaitRow: in("shared_wait_row"), sharedMarker: in("shared_marker"), sharedMarkerRow: in("shared_marker_row"),
		mutexRelease: in("mutex_release"), mutexReleaseRow: in("mutex_release_row"),
		sharedRelease: in("shared_release"), sharedReleaseRow: in("shared_release_row"),
		semAcquire: in("sem_acquire"), semRelease: in("sem_release"), relimit: in("relimit"),
		abandon: in("abandon"),
		epoch:   in("epoch"), rebase: in("rebase"), token: in("token"), retoken: in("retoken"),
		waiterMark: in("waiter_mark"), waiterUnmark: in("waiter_unmark"),
		intentTake: in("intent_take"), intentDrop: in("intent_drop"),
		txTry: in("tx_try"), txWait: in("tx_wait"),
		inspectLimit: in("inspect_limit"), inspect: in("inspect"), list: in("list"),
	}
}

// Results of the statements that take a mutex or a name shared
// (mutex_*.sql, shared_*.sql, tx_*.sql): a token > 0, or one of these.
const (
	tryHeld      = -1 // held by another session, or a writer waits for it
	trySemaphore = -2 // a semaphore of the name is held
	tryLost      = -3 // the key was not held for the unlock after a failed check
	tryMarker    = -4 // shared: the key is held, the semaphore marker was taken at the check (see shared_marker.sql)
)

// Results of mutex_release*.sql and shared_release*.sql.
const (
	releaseNotHeld = 0 // the session did not hold the key
	releaseDone    = 1
	releaseGranted = 2 // Postgres granted the key at once to a blocked waiter
)

// Results of sem_acquire.sql (status) and relimit.sql.
const (
	semTaken     = 0
	semBusy      = 1
	semMismatch  = 2 // another limit is stored
	semCollision = 3 // the limits row is another name's
	semMutex     = 4 // the mutex of the name is held
	semShared    = 5 // the name is held shared

	relimitBusy      = 0
	relimitDone      = 1
	relimitCollision = 3
)

// Key kinds. Every advisory key pglock uses is the first 8 bytes of
// SHA-256("pglock" NUL kind NUL prefix NUL name [NUL slot]) read as a
// big-endian int64 and taken with the one-bigint form of the advisory lock
// functions (objsubid 1 in pg_locks). Names and prefixes contain no NUL, so
// the input is injective; the kinds keep a name's keys apart from each
// other and from every other name's.
const (
	kindMutex   = "m" // the lock of a plain mutex
	kindSlot    = "s" // permit i of a semaphore (with slot)
	kindSemMark = "g" // held shared by a session with a semaphore permit of the name
	kindWaiters = "w" // held shared by a session with a waiter for the name
	kindIntent  = "i" // held by a session with a writer waiting by notifications (WithShared)
	kindLimit   = "l" // primary key of the name's pglock_limits row (no lock)
)

// notifyChannel is the LISTEN/NOTIFY channel of every pglock factory (the
// release statements name it too); the payload is the decimal waiters key
// of the released name.
const notifyChannel = "pglock"

// advisoryKey maps a key kind, prefix, name and optional slot (slot < 0:
// none) to an advisory key. The SQL function pglock_key computes the same.
func advisoryKey(kind, prefix, name string, slot int) int64 {
	h := sha256.New()
	h.Write([]byte("pglock\x00"))
	h.Write([]byte(kind))
	h.Write([]byte{0})
	h.Write([]byte(prefix))
	h.Write([]byte{0})
	h.Write([]byte(name))
	if slot >= 0 {
		h.Write([]byte{0})
		h.Write([]byte(strconv.Itoa(slot)))
	}
	var sum [sha256.Size]byte
	return int64(binary.BigEndian.Uint64(h.Sum(sum[:0])[:8]))
}

// SetupSQL returns the SQL that creates pglock's objects in schema: the
// token counter (a sequence) and the pglock_epoch, pglock_limits and
// pglock_holders tables, and the functions (sql/setup.sql). A factory runs
// it on first use when the objects are missing; an administrator can run it
// beforehand, in one transaction, for a role that may not create objects
// (that role then needs SELECT, INSERT, UPDATE, DELETE on the tables, USAGE
// and UPDATE on the sequence, and EXECUTE on the functions).
func SetupSQL(schema string) string { return inSchema("setup", schema) }

// setupKey serialises racing creators of the objects of one schema.
func setupKey(schema string) int64 { return advisoryKey("setup", "", schema, -1) }

// ensureObjects creates the objects of st's schema on c unless they exist.
func ensureObjects(ctx context.Context, c *pgx.Conn, st *statements) error {
	var ok bool
	if err := c.QueryRow(ctx, st.objectsExist, pgx.QueryExecModeSimpleProtocol, st.schema).Scan(&ok); err != nil {
		return fmt.Errorf("pglock: checking for pglock objects in schema %q: %w", st.schema, err)
	}
	if ok {
		return nil
	}
	tx, err := c.Begin(ctx)
	if err != nil {
		return fmt.Errorf("pglock: creating pglock objects: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	// A transaction lock: whatever happens, it ends with the transaction.
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", pgx.QueryExecModeSimpleProtocol, setupKey(st.schema)); err != nil {
		return fmt.Errorf("pglock: creating pglock objects: %w", err)
	}
	if _, err := tx.Exec(ctx, SetupSQL(st.schema), pgx.QueryExecModeSimpleProtocol); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && (pgErr.Code == "42501" || pgErr.Code == "3F000") {
			return fmt.Errorf("pglock: cannot create pglock objects in schema %q (%w); grant CREATE on the schema, choose another with WithSchema, or have an administrator run pglock.SetupSQL(%q) beforehand", st.schema, err, st.schema)
		}
		return fmt.Errorf("pglock: creating pglock objects in schema %q: %w", st.schema, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("pglock: creating pglock objects in schema %q: %w", st.schema, err)
	}
	return nil
}
