-- Releases a mutex: unlocks the key, then sends NOTIFY (channel pglock, the
-- waiters key in decimal as payload) only if another session waits for the
-- name by notifications (holds its waiters key shared, so that the
-- exclusive try fails; pg_notify returns void, as text of length 0), then
-- asks whether Postgres granted the key at once to a session blocked in
-- pg_advisory_lock (the try fails).
-- $1 mutex key, $2 waiters key.
-- Result: 0 the session did not hold the key, 1 released, 2 released and
-- granted to a blocked waiter; pid.
SELECT CASE WHEN pg_advisory_unlock($1::int8) THEN
		CASE WHEN pg_try_advisory_xact_lock($2::int8) THEN 0 ELSE length(pg_notify('pglock', $2::int8::text)::text) END
		+ CASE WHEN pg_try_advisory_xact_lock($1::int8) THEN 1 ELSE 2 END
	ELSE 0 END, pg_backend_pid()
