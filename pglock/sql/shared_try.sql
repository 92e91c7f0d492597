-- Takes a name shared (WithShared) at once or not at all, with its token:
-- the mutex key shared, only if no writer that waits by notifications
-- holds the intent key (a writer blocked in Postgres's queue of the key
-- makes the try fail by itself), then the semaphore check and the token as
-- in mutex_try.sql. Readers hold the key side by side, so the check takes
-- the semaphore marker for a moment only (a semaphore's acquire takes the
-- marker before it checks the mutex key, which this session holds by then:
-- of the two, one sees the other; nothing can interrupt the statement
-- between the lock and the unlock, so the session never keeps the marker).
-- The check finds the marker taken when a semaphore member holds it, or,
-- rarely, another reader's check does: then the key stays held and -4 asks
-- for shared_marker.sql, which tells the two apart.
-- $1-$3 as mutex_try.sql, $4 intent key.
-- Result: as mutex_try.sql, or -4 (the key held shared, the marker taken).
SELECT CASE WHEN pg_try_advisory_xact_lock_shared($4::int8) THEN
		CASE WHEN pg_try_advisory_lock_shared($1::int8) THEN
			CASE WHEN pg_try_advisory_lock($2::int8) THEN
				CASE WHEN pg_advisory_unlock($2::int8) THEN nextval($3::text::regclass) ELSE -3 END
			ELSE -4 END
		ELSE -1 END
	ELSE -1 END, pg_backend_pid()
