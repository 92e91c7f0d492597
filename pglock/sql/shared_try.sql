-- Takes a name shared (WithShared) at once or not at all, with its token:
-- the mutex key shared, only if no writer that waits by notifications
-- holds the intent key (a writer blocked in Postgres's queue of the key
-- makes the try fail by itself), then the semaphore check and the token as
-- in mutex_try.sql. Readers check the semaphore marker side by side, so one
-- that finds it taken asks pg_locks whether a semaphore member holds it
-- (shared) or only another reader's check (exclusive).
-- $1-$3 as mutex_try.sql, $4 intent key.
-- Result: as mutex_try.sql.
SELECT CASE WHEN pg_try_advisory_xact_lock_shared($4::int8) THEN
		CASE WHEN pg_try_advisory_lock_shared($1::int8) THEN
			CASE WHEN pg_try_advisory_xact_lock($2::int8) THEN nextval($3::text::regclass)
			WHEN NOT EXISTS (SELECT 1 FROM pg_locks l
				WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted AND l.mode = 'ShareLock'
					AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
					AND (l.classid::int8 << 32) | l.objid::int8 = $2::int8) THEN nextval($3::text::regclass)
			WHEN pg_advisory_unlock_shared($1::int8) THEN -2 ELSE -3 END
		ELSE -1 END
	ELSE -1 END, pg_backend_pid()
