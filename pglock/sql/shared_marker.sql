-- The end of a shared take whose check found the semaphore marker taken
-- (shared_*.sql answered -4; the session holds the mutex key shared): the
-- check again, then pg_locks tells a semaphore member, which holds the
-- marker shared, from another reader's check, which held it for a moment.
-- Only for a semaphore is the key given back.
-- $1-$3 as mutex_try.sql.
-- Result: as mutex_try.sql (never -1).
SELECT CASE WHEN pg_try_advisory_lock($2::int8) THEN
		CASE WHEN pg_advisory_unlock($2::int8) THEN nextval($3::text::regclass) ELSE -3 END
	WHEN NOT EXISTS (SELECT 1 FROM pg_locks l
		WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted AND l.mode = 'ShareLock'
			AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
			AND (l.classid::int8 << 32) | l.objid::int8 = $2::int8) THEN nextval($3::text::regclass)
	WHEN pg_advisory_unlock_shared($1::int8) THEN -2 ELSE -3 END, pg_backend_pid()
