-- mutex_try.sql, waiting for the mutex in Postgres's queue of its key: a
-- try first, then pg_advisory_lock, which returns once Postgres grants the
-- key (void: the length of its text is 0), so that the token is still taken
-- in the statement that got the lock. A token taken after waiting in the
-- queue comes negated (below -3: tokens are above 2^32), which tells the
-- factory that the name is contended. It runs on a wait session, whose
-- statement_timeout is 0; a cancel request ends the wait.
-- Parameters: as mutex_try.sql.
-- Result: as mutex_try.sql (never -1), or minus the token.
SELECT CASE WHEN pg_try_advisory_lock($1::int8) THEN
		CASE WHEN pg_try_advisory_xact_lock($2::int8) THEN nextval($3::text::regclass)
		WHEN pg_advisory_unlock($1::int8) THEN -2 ELSE -3 END
	WHEN length(pg_advisory_lock($1::int8)::text) = 0 THEN
		CASE WHEN pg_try_advisory_xact_lock($2::int8) THEN -nextval($3::text::regclass)
		WHEN pg_advisory_unlock($1::int8) THEN -2 ELSE -3 END
	END, pg_backend_pid()
