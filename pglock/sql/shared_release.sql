-- Releases a reader (WithShared): unlocks the key shared and notifies as
-- mutex_release.sql does.
-- $1 mutex key, $2 waiters key.
-- Result: 0 the session did not hold the key, 1 released; pid.
SELECT CASE WHEN pg_advisory_unlock_shared($1::int8) THEN
		1 + CASE WHEN pg_try_advisory_xact_lock($2::int8) THEN 0 ELSE length(pg_notify('pglock', $2::int8::text)::text) END
	ELSE 0 END, pg_backend_pid()
