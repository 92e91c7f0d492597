package pglock

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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
	kindIntent  = "i" // held by a session with a writer waiting in notify mode (WithShared)
	kindLimit   = "l" // primary key of the name's pglock_limits row (no lock)
)

// notifyChannel is the LISTEN/NOTIFY channel of every pglock factory; the
// payload is the decimal waiters key of the released name.
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

// statements holds the SQL of one schema.
type statements struct {
	schema string
	exists string // true when every object is in place

	mutexAcquire, mutexAcquirePub, mutexRelease, mutexReleasePub string
	mutexWait, mutexWaitPub                                      string
	txTry, txWait                                                string
	sharedAcquire, sharedAcquirePub, sharedJoin, sharedJoinPub   string
	sharedRelease, sharedReleasePub                              string
	semAcquire, semRelease, relimit                              string
	epoch, rebase, token, retoken                                string
	unlock, inspectLimit, inspect                                string
	list                                                         string
}

func newStatements(schema string) *statements {
	q := func(name string) string { return pgx.Identifier{schema, name}.Sanitize() }
	lit := func(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
	// The mutex key first; then, only if it was taken, the check that no
	// other session holds a permit of a semaphore of the same name (its
	// marker key, held shared), and the token counter (a raw value, which
	// the factory checks against the epoch), in that order (CASE evaluates
	// in order). Results: > 0 taken (the counter value), -1 busy, -2 a
	// semaphore of the name is held.
	const mutexTry = `CASE WHEN pg_try_advisory_lock($1::int8) THEN
			CASE WHEN pg_try_advisory_xact_lock($2::int8) THEN nextval(@ctr@::regclass)
			WHEN pg_advisory_unlock($1::int8) THEN -2 ELSE -3 END
		ELSE -1 END`
	try := strings.ReplaceAll(mutexTry, "@ctr@", lit(q("pglock_token_counter")))
	// The same, waiting for the mutex in Postgres's queue of the key
	// (pg_advisory_lock returns void: as the empty string's length it is
	// true once granted), so the token is still taken in the statement
	// that got the lock.
	wait := strings.Replace(try, "pg_try_advisory_lock($1::int8)", "length(pg_advisory_lock($1::int8)::text) = 0", 1)
	// In the caller's transaction (AcquireInTx): the mutex key as a
	// transaction lock, then the semaphore check on the marker key as a
	// session lock given back in the same expression (a transaction lock
	// on it would stall semaphore acquirers until the transaction ends),
	// then the counter. The same results; after -2 the transaction keeps
	// the mutex key, which it cannot give back, until it ends.
	const txTry = `CASE WHEN pg_try_advisory_xact_lock($1::int8) THEN
			CASE WHEN NOT pg_try_advisory_lock($2::int8) THEN -2
			WHEN pg_advisory_unlock($2::int8) THEN nextval(@ctr@::regclass) ELSE -3 END
		ELSE -1 END`
	txTryQ := strings.ReplaceAll(txTry, "@ctr@", lit(q("pglock_token_counter")))
	txWaitQ := strings.Replace(txTryQ, "pg_try_advisory_xact_lock($1::int8)", "length(pg_advisory_xact_lock($1::int8)::text) = 0", 1)
	pub := func(try string) string {
		return `WITH a AS (SELECT ` + try + ` AS tok),
			i AS (INSERT INTO ` + q("pglock_holders") + ` (key, token, ns, name, slot, lim, pid, since, owner, metadata)
				SELECT $1::int8, tok, $3::text, $4::text, 0, 1, pg_backend_pid(), now(), $5::text, $6::jsonb FROM a WHERE tok > 0)
			SELECT tok, pg_backend_pid() FROM a`
	}
	// 1 when no other session waits for the name (none holds its waiters
	// key shared), else 2 after a NOTIFY with the key in decimal. pg_notify
	// returns void: as the empty string's length it stays a plain
	// expression.
	const handed = ` + CASE WHEN pg_try_advisory_xact_lock($1::int8) THEN 0 ELSE 4 END`
	const notify = `CASE WHEN pg_try_advisory_xact_lock($2::int8) THEN 1 ELSE 2 + length(pg_notify('` + notifyChannel + `', $2::int8::text)::text) END`
	// Shared (WithShared): the mutex key taken shared, only if no writer
	// waits in notify mode (holds the intent key, @i@) — a writer blocked
	// in Postgres's queue of the key makes the try fail by itself, unless
	// the session holds the key already (@j@: a reader joins this
	// factory's readers), which Postgres grants again without looking at
	// its queue, so then pg_locks is asked (only then: planning the view
	// costs as much as the rest) — then the semaphore check and
	// the token as for a mutex. Readers check the semaphore marker side by
	// side, so one that finds it taken asks pg_locks whether a semaphore
	// member holds it (shared) or only another reader's check (exclusive).
	const lockHeld = `EXISTS (SELECT 1 FROM pg_locks l
			WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted = @granted@ AND l.mode = '@mode@'
				AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
				AND (l.classid::int8 << 32) | l.objid::int8 = @key@)`
	held := func(key, mode, granted string) string {
		return strings.NewReplacer("@key@", key, "@mode@", mode, "@granted@", granted).Replace(lockHeld)
	}
	sharedTry := `CASE @j@ WHEN pg_try_advisory_xact_lock_shared(@i@) THEN
			CASE WHEN pg_try_advisory_lock_shared($1::int8) THEN
				CASE WHEN pg_try_advisory_xact_lock($2::int8) THEN nextval(@ctr@::regclass)
				WHEN NOT ` + held("$2::int8", "ShareLock", "true") + ` THEN nextval(@ctr@::regclass)
				WHEN pg_advisory_unlock_shared($1::int8) THEN -2 ELSE -3 END
			ELSE -1 END
		ELSE -1 END`
	shared := func(intent string, join bool) string {
		j := ""
		if join {
			j = `WHEN ` + held("$1::int8", "ExclusiveLock", "false") + ` THEN -1`
		}
		return strings.NewReplacer("@ctr@", lit(q("pglock_token_counter")), "@i@", intent, "@j@", j).Replace(sharedTry)
	}
	return &statements{
		schema: schema,
		exists: `SELECT to_regclass(` + lit(q("pglock_limits")) + `) IS NOT NULL
			AND to_regclass(` + lit(q("pglock_holders")) + `) IS NOT NULL
			AND to_regclass(` + lit(q("pglock_token_counter")) + `) IS NOT NULL
			AND to_regclass(` + lit(q("pglock_epoch")) + `) IS NOT NULL
			AND to_regprocedure(` + lit(q("pglock_token_v1")+"()") + `) IS NOT NULL
			AND to_regprocedure(` + lit(q("pglock_rebase_v1")+"()") + `) IS NOT NULL
			AND to_regprocedure(` + lit(q("pglock_key")+"(text,text,text,integer)") + `) IS NOT NULL
			AND to_regprocedure(` + lit(q("pglock_sem_acquire_v3")+"(bigint[],integer[],bigint,boolean,bigint,bigint,integer,text,text,boolean,text,jsonb)") + `) IS NOT NULL
			AND to_regprocedure(` + lit(q("pglock_sem_release_v1")+"(bigint,bigint,boolean,bigint,text,bigint)") + `) IS NOT NULL
			AND to_regprocedure(` + lit(q("pglock_relimit_v1")+"(bigint[],bigint,integer,text,text)") + `) IS NOT NULL`,

		// One round trip each.
		mutexAcquire: `SELECT ` + try + `, pg_backend_pid()`,
		// The same, also writing the holder's row for Inspect when the lock
		// was taken ($3 prefix, $4 name, $5 owner, $6 metadata). The CTE is
		// referenced twice, so it runs once.
		mutexAcquirePub: pub(try),
		mutexWait:       `SELECT ` + wait + `, pg_backend_pid()`,
		txTry:           `SELECT ` + txTryQ + `, pg_backend_pid()`,
		txWait:          `SELECT ` + txWaitQ + `, pg_backend_pid()`,
		mutexWaitPub:    pub(wait),
		// Unlock, then NOTIFY only if another session has a waiter for the
		// name (holds the waiters key shared, so the exclusive try fails),
		// plus 4 if Postgres granted the key to a blocked waiter at once.
		// 0 means the session did not hold the key.
		mutexRelease: `SELECT CASE WHEN pg_advisory_unlock($1::int8) THEN ` + notify + handed + ` ELSE 0 END, pg_backend_pid()`,
		// The same, also deleting the holder's row ($3 its token).
		mutexReleasePub: `WITH d AS (DELETE FROM ` + q("pglock_holders") + ` WHERE key = $1::int8 AND token = $3::int8)
			SELECT CASE WHEN pg_advisory_unlock($1::int8) THEN ` + notify + handed + ` ELSE 0 END, pg_backend_pid()`,

		// Shared: $3 the intent key; published, $7 (after the row's).
		sharedAcquire:    `SELECT ` + shared("$3::int8", false) + `, pg_backend_pid()`,
		sharedAcquirePub: pub(shared("$7::int8", false)),
		sharedJoin:       `SELECT ` + shared("$3::int8", true) + `, pg_backend_pid()`,
		sharedJoinPub:    pub(shared("$7::int8", true)),
		sharedRelease:    `SELECT CASE WHEN pg_advisory_unlock_shared($1::int8) THEN ` + notify + ` ELSE 0 END, pg_backend_pid()`,
		sharedReleasePub: `WITH d AS (DELETE FROM ` + q("pglock_holders") + ` WHERE key = $1::int8 AND token = $3::int8)
			SELECT CASE WHEN pg_advisory_unlock_shared($1::int8) THEN ` + notify + ` ELSE 0 END, pg_backend_pid()`,

		semAcquire:   `SELECT slot, token, stored, pid, status FROM ` + q("pglock_sem_acquire_v3") + `($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)`,
		semRelease:   `SELECT ok, pid FROM ` + q("pglock_sem_release_v1") + `($1, $2, $3, $4, $5, $6)`,
		relimit:      `SELECT ` + q("pglock_relimit_v1") + `($1, $2, $3, $4, $5), pg_backend_pid()`,
		inspectLimit: `SELECT lim, ns, name FROM ` + q("pglock_limits") + ` WHERE key = $1`,
		// One page of the names with holder rows, in byte order, after $3.
		list: `SELECT DISTINCT name COLLATE "C" FROM ` + q("pglock_holders") + `
			WHERE ns = $1 AND starts_with(name, $2) AND name COLLATE "C" > $3
			ORDER BY 1 LIMIT $4`,

		epoch:  `SELECT coalesce((SELECT e FROM ` + q("pglock_epoch") + `), 0), pg_backend_pid()`,
		rebase: `SELECT pg_backend_pid() FROM ` + q("pglock_rebase_v1") + `()`,
		token:  `SELECT token, epoch, pg_backend_pid() FROM ` + q("pglock_token_v1") + `()`,
		// A holder's row gets the token that replaced an out-of-range value.
		retoken: `UPDATE ` + q("pglock_holders") + ` SET token = $3 WHERE key = $1 AND token = $2 AND pid = pg_backend_pid()`,
		// Gives up keys ($1) and a semaphore marker ($2, if $3) taken for a
		// holder that is not to be, with the rows written for them.
		unlock: `WITH d AS (DELETE FROM ` + q("pglock_holders") + ` WHERE key = ANY($1::int8[]) AND pid = pg_backend_pid())
			SELECT pg_advisory_unlock(k) FROM unnest($1::int8[]) k
			UNION ALL SELECT pg_advisory_unlock_shared($2::int8) WHERE $3::bool`,

		// Held keys of the name, with the holder rows and the sessions'
		// pg_stat_activity entries. Only readers (WithShared) hold a
		// mutex key shared: a session's readers are one row of pg_locks,
		// shown with the newest reader's holder row.
		inspect: `SELECT (l.classid::int8 << 32) | l.objid::int8 AS key, l.pid,
				h.token, h.since, h.owner, h.metadata::text,
				a.application_name, host(a.client_addr)
			FROM pg_locks l
			LEFT JOIN LATERAL (SELECT * FROM ` + q("pglock_holders") + ` h
				WHERE h.key = (l.classid::int8 << 32) | l.objid::int8 AND h.pid = l.pid
				ORDER BY h.token DESC LIMIT 1) h ON true
			LEFT JOIN pg_stat_activity a ON a.pid = l.pid
			WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted AND l.mode IN ('ExclusiveLock', 'ShareLock')
				AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
				AND (l.classid::int8 << 32) | l.objid::int8 = ANY($1::int8[])`,
	}
}

// SetupSQL returns the SQL that creates pglock's objects in schema: the
// token counter (a sequence) and the pglock_epoch, pglock_limits and
// pglock_holders tables, and the functions. A factory runs it on first use
// when the objects are missing; an administrator can run it beforehand for
// a role that may not create objects (that role then needs SELECT, INSERT,
// UPDATE, DELETE on the tables, USAGE and UPDATE on the sequence, and
// EXECUTE on the functions).
func SetupSQL(schema string) string {
	q := func(name string) string { return pgx.Identifier{schema, name}.Sanitize() }
	lit := func(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
	r := strings.NewReplacer(
		"@ctr@", q("pglock_token_counter"),
		"@ctrlit@", lit(q("pglock_token_counter")),
		"@epoch@", q("pglock_epoch"),
		"@token@", q("pglock_token_v1"),
		"@rebase@", q("pglock_rebase_v1"),
		"@rebasekey@", strconv.FormatInt(advisoryKey("rebase", "", schema, -1), 10),
		"@limits@", q("pglock_limits"),
		"@holders@", q("pglock_holders"),
		"@key@", q("pglock_key"),
		"@semacq@", q("pglock_sem_acquire_v3"),
		"@semrel@", q("pglock_sem_release_v1"),
		"@relimit@", q("pglock_relimit_v1"),
		"@chan@", notifyChannel,
	)
	return r.Replace(setupTemplate)
}

// Tokens are values of a counter, an unlogged sequence (PostgreSQL 15
// and later; a logged one before): no WAL and no flush on the hot path.
// The counter runs in the range of an epoch, a row of a logged table: a
// value v is a token only if epoch*2^32 < v < epoch*2^32 + 2^31 for a
// committed epoch. A new epoch is committed (and so flushed) before its
// range can be accepted, and it is always above the last one, so a crash,
// which resets the counter, never yields a token twice: the next acquire
// finds the counter out of range and moves to a new epoch. A new epoch is
// at least the server clock in microseconds / 2^21, so objects dropped and
// created again also start above earlier tokens (unless epochs were used
// up faster than one every two seconds).
const setupTemplate = `
DO $pglock$ BEGIN
	IF to_regclass(@ctrlit@) IS NULL THEN
		IF current_setting('server_version_num')::int >= 150000 THEN
			EXECUTE 'CREATE UNLOGGED SEQUENCE @ctr@ AS bigint';
		ELSE
			EXECUTE 'CREATE SEQUENCE @ctr@ AS bigint';
		END IF;
	END IF;
END $pglock$;

CREATE TABLE IF NOT EXISTS @epoch@ (
	one boolean PRIMARY KEY DEFAULT true CHECK (one),
	e   bigint NOT NULL
);

CREATE TABLE IF NOT EXISTS @limits@ (
	key     bigint PRIMARY KEY,
	ns      text NOT NULL,
	name    text NOT NULL,
	lim     integer NOT NULL CHECK (lim > 1),
	updated timestamptz NOT NULL DEFAULT now()
);

CREATE UNLOGGED TABLE IF NOT EXISTS @holders@ (
	key      bigint NOT NULL,
	token    bigint NOT NULL,
	ns       text NOT NULL,
	name     text NOT NULL,
	slot     integer NOT NULL,
	lim      integer NOT NULL,
	pid      integer NOT NULL,
	since    timestamptz NOT NULL,
	owner    text NOT NULL DEFAULT '',
	metadata jsonb,
	PRIMARY KEY (key, token)
);

CREATE OR REPLACE FUNCTION @key@(kind text, prefix text, name text, slot integer DEFAULT NULL)
RETURNS bigint LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $pglock$
	SELECT ('x' || encode(substr(sha256(
		'pglock'::bytea || '\x00'::bytea || convert_to(kind, 'UTF8') || '\x00'::bytea
		|| convert_to(prefix, 'UTF8') || '\x00'::bytea || convert_to(name, 'UTF8')
		|| CASE WHEN slot IS NULL THEN ''::bytea ELSE '\x00'::bytea || convert_to(slot::text, 'UTF8') END
	), 1, 8), 'hex'))::bit(64)::bigint
$pglock$;

-- A counter value and the committed epoch, with token -4 if the value is
-- outside the epoch's range.
CREATE OR REPLACE FUNCTION @token@(OUT token bigint, OUT epoch bigint) LANGUAGE plpgsql AS $pglock$
BEGIN
	token := nextval(@ctrlit@::regclass);
	SELECT p.e INTO epoch FROM @epoch@ p;
	IF epoch IS NULL OR token <= epoch * 4294967296 OR token >= epoch * 4294967296 + 2147483648 THEN
		token := -4;
	END IF;
END
$pglock$;

-- Moves the counter to a new epoch, unless another session just did. The
-- new epoch is visible, and so its range usable, only once this commits.
CREATE OR REPLACE FUNCTION @rebase@() RETURNS void LANGUAGE plpgsql AS $pglock$
DECLARE
	ep bigint;
	c bigint;
BEGIN
	PERFORM pg_advisory_xact_lock(@rebasekey@);
	SELECT p.e INTO ep FROM @epoch@ p;
	c := coalesce(pg_sequence_last_value(@ctrlit@::regclass), 0);
	IF ep IS NOT NULL AND c > ep * 4294967296 AND c < ep * 4294967296 + 2147483648 - 1000000 THEN
		RETURN;
	END IF;
	ep := greatest(coalesce(ep, 0) + 1, (extract(epoch FROM clock_timestamp()) * 1000000)::bigint >> 21);
	INSERT INTO @epoch@ AS p (e) VALUES (ep) ON CONFLICT (one) DO UPDATE SET e = excluded.e;
	PERFORM setval(@ctrlit@::regclass, ep * 4294967296);
END
$pglock$;

-- status: 0 taken (token: the counter value), 1 busy, 2 limit mismatch (stored = the limit in force), 3 the limits row belongs
-- to another name (key collision), 4 the mutex of the name is held, 5 the name is held shared (WithShared).
-- With p_pub, a permit taken is written to the holders table with p_owner and p_meta.
CREATE OR REPLACE FUNCTION @semacq@(
	p_keys bigint[], p_slots integer[], p_mark bigint, p_take_mark boolean,
	p_mutex bigint, p_limkey bigint, p_lim integer, p_ns text, p_name text,
	p_pub boolean, p_owner text, p_meta jsonb,
	OUT slot integer, OUT token bigint, OUT stored integer, OUT pid integer, OUT status integer)
LANGUAGE plpgsql AS $pglock$
DECLARE
	i integer;
	k bigint;
	r record;
	held text;
BEGIN
	pid := pg_backend_pid();
	-- Own marker first, then the check for a mutex holder or a reader
	-- (WithShared) of the name: of either and a semaphore acquiring at
	-- once, at least one sees the other. The check takes the mutex key
	-- exclusive and gives it back in the same expression (a transaction
	-- lock would outlive the marker, given back below on failure). Readers'
	-- shared holds fail the try too; so, rarely, does another session's
	-- check at the same moment, told apart in pg_locks by the marker it
	-- holds shared (asked only when the try fails; a prepared transaction's
	-- pid is NULL).
	IF p_take_mark THEN
		PERFORM pg_advisory_lock_shared(p_mark);
	END IF;
	IF NOT (CASE WHEN pg_try_advisory_lock(p_mutex) THEN pg_advisory_unlock(p_mutex) ELSE false END) THEN
		WITH l AS (SELECT l.pid, l.mode, (l.classid::int8 << 32) | l.objid::int8 AS key FROM pg_locks l
			WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted
				AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()))
		SELECT min(h.mode) INTO held FROM l h
		WHERE h.key = p_mutex AND h.pid IS DISTINCT FROM pg_backend_pid()
			AND NOT EXISTS (SELECT 1 FROM l g WHERE g.pid = h.pid AND g.key = p_mark AND g.mode = 'ShareLock');
		IF held IS NOT NULL THEN
			IF p_take_mark THEN PERFORM pg_advisory_unlock_shared(p_mark); END IF;
			status := CASE held WHEN 'ShareLock' THEN 5 ELSE 4 END;
			RETURN;
		END IF;
	END IF;
	-- Without the right limit stored, touch no permit: a transient hold
	-- would make a concurrent limit change fail.
	SELECT l.lim, l.ns, l.name INTO r FROM @limits@ l WHERE l.key = p_limkey;
	IF coalesce(r.lim, 1) <> p_lim THEN
		IF p_take_mark THEN PERFORM pg_advisory_unlock_shared(p_mark); END IF;
		status := 2; stored := coalesce(r.lim, 1);
		RETURN;
	END IF;
	FOR i IN 1 .. coalesce(array_length(p_keys, 1), 0) LOOP
		IF pg_try_advisory_lock(p_keys[i]) THEN
			slot := p_slots[i]; k := p_keys[i];
			EXIT;
		END IF;
	END LOOP;
	-- A fresh snapshot, taken after the permit: a limit changed by a
	-- session that held every permit while it committed is seen here.
	SELECT l.lim, l.ns, l.name INTO r FROM @limits@ l WHERE l.key = p_limkey;
	IF FOUND AND (r.ns <> p_ns OR r.name <> p_name) THEN
		status := 3;
	ELSIF coalesce(r.lim, 1) <> p_lim THEN
		status := 2; stored := coalesce(r.lim, 1);
	ELSIF slot IS NULL THEN
		status := 1;
	ELSE
		status := 0; stored := r.lim;
		token := nextval(@ctrlit@::regclass);
		IF p_pub THEN
			INSERT INTO @holders@ (key, token, ns, name, slot, lim, pid, since, owner, metadata)
			VALUES (k, token, p_ns, p_name, slot, p_lim, pid, now(), p_owner, p_meta);
		END IF;
		RETURN;
	END IF;
	IF k IS NOT NULL THEN PERFORM pg_advisory_unlock(k); END IF;
	IF p_take_mark THEN PERFORM pg_advisory_unlock_shared(p_mark); END IF;
	slot := NULL;
END
$pglock$;

CREATE OR REPLACE FUNCTION @semrel@(
	p_key bigint, p_mark bigint, p_drop_mark boolean, p_waiters bigint, p_payload text, p_token bigint,
	OUT ok boolean, OUT pid integer)
LANGUAGE plpgsql AS $pglock$
BEGIN
	pid := pg_backend_pid();
	IF p_token IS NOT NULL THEN
		DELETE FROM @holders@ WHERE key = p_key AND token = p_token;
	END IF;
	ok := pg_advisory_unlock(p_key);
	IF p_drop_mark THEN PERFORM pg_advisory_unlock_shared(p_mark); END IF;
	IF ok AND NOT pg_try_advisory_xact_lock(p_waiters) THEN
		PERFORM pg_notify('@chan@', p_payload);
	END IF;
END
$pglock$;

-- Sets the stored limit of a name, only while nobody holds any permit of
-- the old or the new limit: every permit key is taken as a transaction
-- lock, held until the change is committed and visible. 1 done (or already
-- so), 0 busy, 3 the row belongs to another name.
CREATE OR REPLACE FUNCTION @relimit@(
	p_keys bigint[], p_limkey bigint, p_lim integer, p_ns text, p_name text)
RETURNS integer LANGUAGE plpgsql AS $pglock$
DECLARE
	k bigint;
	r record;
BEGIN
	-- One change of a name's limit at a time; who waited sees the result
	-- (a fresh snapshot, taken after the lock).
	PERFORM pg_advisory_xact_lock(p_limkey);
	SELECT l.lim, l.ns, l.name INTO r FROM @limits@ l WHERE l.key = p_limkey;
	IF FOUND AND (r.ns <> p_ns OR r.name <> p_name) THEN RETURN 3; END IF;
	IF coalesce(r.lim, 1) = p_lim THEN RETURN 1; END IF;
	FOREACH k IN ARRAY p_keys LOOP
		IF NOT pg_try_advisory_xact_lock(k) THEN RETURN 0; END IF;
	END LOOP;
	INSERT INTO @limits@ AS l (key, ns, name, lim) VALUES (p_limkey, p_ns, p_name, p_lim)
	ON CONFLICT (key) DO UPDATE SET lim = excluded.lim, updated = now()
		WHERE l.ns = excluded.ns AND l.name = excluded.name;
	IF NOT FOUND THEN RETURN 3; END IF;
	RETURN 1;
END
$pglock$;
`

// setupKey serialises racing creators of the objects of one schema.
func setupKey(schema string) int64 { return advisoryKey("setup", "", schema, -1) }

// ensureObjects creates the objects of st's schema on c unless they exist.
func ensureObjects(ctx context.Context, c *pgx.Conn, st *statements) error {
	var ok bool
	if err := c.QueryRow(ctx, st.exists, pgx.QueryExecModeSimpleProtocol).Scan(&ok); err != nil {
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
