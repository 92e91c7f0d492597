-- Creates pglock's objects in the schema :"schema" (which must exist), or
-- leaves those that exist: the token counter (a sequence), the tables
-- pglock_epoch, pglock_limits and pglock_holders, and the functions. A
-- factory runs it, in a transaction under a transaction advisory lock, when
-- an object is missing; an administrator can run it beforehand:
--
--	psql -v schema=public -1 -f sql/setup.sql
--
-- Objects are named :"schema".name, which psql fills in from -v schema=...
-- and pglock from WithSchema. The functions run with search_path set to the
-- schema, so that their bodies (quoted text, which psql leaves alone) name
-- objects without it.
--
-- Tokens are values of the counter, an unlogged sequence (PostgreSQL 15 and
-- later; a logged one before): no WAL and no flush on the hot path. The
-- counter runs in the range of an epoch, the row of pglock_epoch (logged): a
-- value v is a token only if epoch*2^32 < v < epoch*2^32 + 2^31 for a
-- committed epoch. A new epoch is committed (and so flushed) before its
-- range can be accepted, and it is always above the last one, so a crash,
-- which resets the counter, never yields a token twice: the next acquire
-- finds the counter out of range and moves to a new epoch. A new epoch is at
-- least the server clock in microseconds / 2^21, so objects dropped and
-- created again also start above earlier tokens (unless epochs were used up
-- faster than one every two seconds).

-- The counter, unlogged where the server can. The branch runs in a function
-- made for it and dropped again, so that the schema is named outside quotes.
CREATE OR REPLACE FUNCTION :"schema".pglock_setup_counter() RETURNS void LANGUAGE plpgsql
SET search_path = :"schema" AS $pglock$
BEGIN
	IF to_regclass('pglock_token_counter') IS NULL THEN
		IF current_setting('server_version_num')::int >= 150000 THEN
			CREATE UNLOGGED SEQUENCE pglock_token_counter AS bigint;
		ELSE
			CREATE SEQUENCE pglock_token_counter AS bigint;
		END IF;
	END IF;
END
$pglock$;
SELECT :"schema".pglock_setup_counter();
DROP FUNCTION :"schema".pglock_setup_counter();

CREATE TABLE IF NOT EXISTS :"schema".pglock_epoch (
	one boolean PRIMARY KEY DEFAULT true CHECK (one),
	e   bigint NOT NULL
);

-- One row per semaphore name: its limit.
CREATE TABLE IF NOT EXISTS :"schema".pglock_limits (
	key     bigint PRIMARY KEY,
	ns      text NOT NULL,
	name    text NOT NULL,
	lim     integer NOT NULL CHECK (lim > 1),
	updated timestamptz NOT NULL DEFAULT now()
);

-- One row per holder, written by the statement that takes the lock and
-- deleted by the one that releases it (rows of sessions that ended are
-- ignored, and swept when a lock session opens).
CREATE UNLOGGED TABLE IF NOT EXISTS :"schema".pglock_holders (
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

-- The advisory key of a name: the first 8 bytes of
-- SHA-256("pglock" NUL kind NUL prefix NUL name [NUL slot]), big-endian.
CREATE OR REPLACE FUNCTION :"schema".pglock_key(kind text, prefix text, name text, slot integer DEFAULT NULL)
RETURNS bigint LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $pglock$
	SELECT ('x' || encode(substr(sha256(
		'pglock'::bytea || '\x00'::bytea || convert_to(kind, 'UTF8') || '\x00'::bytea
		|| convert_to(prefix, 'UTF8') || '\x00'::bytea || convert_to(name, 'UTF8')
		|| CASE WHEN slot IS NULL THEN ''::bytea ELSE '\x00'::bytea || convert_to(slot::text, 'UTF8') END
	), 1, 8), 'hex'))::bit(64)::bigint
$pglock$;

-- A counter value and the committed epoch, with token -4 if the value is
-- outside the epoch's range.
CREATE OR REPLACE FUNCTION :"schema".pglock_token_v1(OUT token bigint, OUT epoch bigint) LANGUAGE plpgsql
SET search_path = :"schema" AS $pglock$
BEGIN
	token := nextval('pglock_token_counter');
	SELECT p.e INTO epoch FROM pglock_epoch p;
	IF epoch IS NULL OR token <= epoch * 4294967296 OR token >= epoch * 4294967296 + 2147483648 THEN
		token := -4;
	END IF;
END
$pglock$;

-- Moves the counter to a new epoch, unless another session just did. The
-- new epoch is visible, and so its range usable, only once this commits.
CREATE OR REPLACE FUNCTION :"schema".pglock_rebase_v1() RETURNS void LANGUAGE plpgsql
SET search_path = :"schema" AS $pglock$
DECLARE
	ep bigint;
	c bigint;
BEGIN
	PERFORM pg_advisory_xact_lock(pglock_key('rebase', '', current_schema()));
	SELECT p.e INTO ep FROM pglock_epoch p;
	c := coalesce(pg_sequence_last_value('pglock_token_counter'), 0);
	IF ep IS NOT NULL AND c > ep * 4294967296 AND c < ep * 4294967296 + 2147483648 - 1000000 THEN
		RETURN;
	END IF;
	ep := greatest(coalesce(ep, 0) + 1, (extract(epoch FROM clock_timestamp()) * 1000000)::bigint >> 21);
	INSERT INTO pglock_epoch AS p (e) VALUES (ep) ON CONFLICT (one) DO UPDATE SET e = excluded.e;
	PERFORM setval('pglock_token_counter', ep * 4294967296);
END
$pglock$;

-- Takes a semaphore permit: one of p_keys (slots p_slots) at once, with its
-- token and, with p_pub, the holder's row (p_owner, p_meta).
-- status: 0 taken (token: the counter value), 1 busy, 2 limit mismatch
-- (stored: the limit in force), 3 the limits row belongs to another name
-- (key collision), 4 the mutex of the name is held, 5 the name is held
-- shared (WithShared).
CREATE OR REPLACE FUNCTION :"schema".pglock_sem_acquire_v3(
	p_keys bigint[], p_slots integer[], p_mark bigint, p_take_mark boolean,
	p_mutex bigint, p_limkey bigint, p_lim integer, p_ns text, p_name text,
	p_pub boolean, p_owner text, p_meta jsonb,
	OUT slot integer, OUT token bigint, OUT stored integer, OUT pid integer, OUT status integer)
LANGUAGE plpgsql SET search_path = :"schema" AS $pglock$
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
	SELECT l.lim, l.ns, l.name INTO r FROM pglock_limits l WHERE l.key = p_limkey;
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
	SELECT l.lim, l.ns, l.name INTO r FROM pglock_limits l WHERE l.key = p_limkey;
	IF FOUND AND (r.ns <> p_ns OR r.name <> p_name) THEN
		status := 3;
	ELSIF coalesce(r.lim, 1) <> p_lim THEN
		status := 2; stored := coalesce(r.lim, 1);
	ELSIF slot IS NULL THEN
		status := 1;
	ELSE
		status := 0; stored := r.lim;
		token := nextval('pglock_token_counter');
		IF p_pub THEN
			INSERT INTO pglock_holders (key, token, ns, name, slot, lim, pid, since, owner, metadata)
			VALUES (k, token, p_ns, p_name, slot, p_lim, pid, now(), p_owner, p_meta);
		END IF;
		RETURN;
	END IF;
	IF k IS NOT NULL THEN PERFORM pg_advisory_unlock(k); END IF;
	IF p_take_mark THEN PERFORM pg_advisory_unlock_shared(p_mark); END IF;
	slot := NULL;
END
$pglock$;

-- Releases a semaphore permit (p_key), deleting its row (p_token) and the
-- session's marker (p_drop_mark), and notifies p_payload if another session
-- waits for the name (holds p_waiters shared).
CREATE OR REPLACE FUNCTION :"schema".pglock_sem_release_v1(
	p_key bigint, p_mark bigint, p_drop_mark boolean, p_waiters bigint, p_payload text, p_token bigint,
	OUT ok boolean, OUT pid integer)
LANGUAGE plpgsql SET search_path = :"schema" AS $pglock$
BEGIN
	pid := pg_backend_pid();
	IF p_token IS NOT NULL THEN
		DELETE FROM pglock_holders WHERE key = p_key AND token = p_token;
	END IF;
	ok := pg_advisory_unlock(p_key);
	IF p_drop_mark THEN PERFORM pg_advisory_unlock_shared(p_mark); END IF;
	IF ok AND NOT pg_try_advisory_xact_lock(p_waiters) THEN
		PERFORM pg_notify('pglock', p_payload);
	END IF;
END
$pglock$;

-- Sets the stored limit of a name, only while nobody holds any permit of
-- the old or the new limit: every permit key is taken as a transaction
-- lock, held until the change is committed and visible. 1 done (or already
-- so), 0 busy, 3 the row belongs to another name.
CREATE OR REPLACE FUNCTION :"schema".pglock_relimit_v1(
	p_keys bigint[], p_limkey bigint, p_lim integer, p_ns text, p_name text)
RETURNS integer LANGUAGE plpgsql SET search_path = :"schema" AS $pglock$
DECLARE
	k bigint;
	r record;
BEGIN
	-- One change of a name's limit at a time; who waited sees the result
	-- (a fresh snapshot, taken after the lock).
	PERFORM pg_advisory_xact_lock(p_limkey);
	SELECT l.lim, l.ns, l.name INTO r FROM pglock_limits l WHERE l.key = p_limkey;
	IF FOUND AND (r.ns <> p_ns OR r.name <> p_name) THEN RETURN 3; END IF;
	IF coalesce(r.lim, 1) = p_lim THEN RETURN 1; END IF;
	FOREACH k IN ARRAY p_keys LOOP
		IF NOT pg_try_advisory_xact_lock(k) THEN RETURN 0; END IF;
	END LOOP;
	INSERT INTO pglock_limits AS l (key, ns, name, lim) VALUES (p_limkey, p_ns, p_name, p_lim)
	ON CONFLICT (key) DO UPDATE SET lim = excluded.lim, updated = now()
		WHERE l.ns = excluded.ns AND l.name = excluded.name;
	IF NOT FOUND THEN RETURN 3; END IF;
	RETURN 1;
END
$pglock$;
