-- shared_try.sql, waiting for the name in Postgres's queue of its mutex
-- key: a try first, then pg_advisory_lock_shared, which returns once
-- Postgres grants the key shared (void: the length of its text is 0). It
-- waits while the key is held exclusive or a writer waits in the queue (the
-- reader queues behind it: writer preference), and at the release Postgres
-- grants it to every reader queued before the next writer. A writer that
-- waits by notifications (its intent key taken) turns the reader away
-- before it queues: the intent key is taken shared for a moment only, so
-- that a writer may take it meanwhile. A token taken after waiting in the
-- queue comes negated, as in mutex_wait.sql. It runs on a wait session,
-- whose statement_timeout is 0; a cancel request ends the wait.
-- Parameters: as shared_try.sql.
-- Result: as shared_try.sql (-1 only when turned away, without the key), or
-- minus the token.
SELECT CASE WHEN NOT pg_try_advisory_lock_shared($4::int8) THEN -1
	WHEN NOT pg_advisory_unlock_shared($4::int8) THEN -3
	WHEN pg_try_advisory_lock_shared($1::int8) THEN
		CASE WHEN pg_try_advisory_lock($2::int8) THEN
			CASE WHEN pg_advisory_unlock($2::int8) THEN nextval($3::text::regclass) ELSE -3 END
		ELSE -4 END
	WHEN length(pg_advisory_lock_shared($1::int8)::text) = 0 THEN
		CASE WHEN pg_try_advisory_lock($2::int8) THEN
			CASE WHEN pg_advisory_unlock($2::int8) THEN -nextval($3::text::regclass) ELSE -3 END
		ELSE -4 END
	END, pg_backend_pid()
