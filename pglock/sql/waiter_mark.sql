-- Marks a name as waited for by the session (its waiters key, held shared),
-- so that releases in other sessions notify (see mutex_release.sql).
-- $1 waiters key.
-- Result: true, pid.
SELECT true, pg_backend_pid() FROM pg_advisory_lock_shared($1::int8)
