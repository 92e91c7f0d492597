-- Gives back the mark of waiter_mark.sql.
-- $1 waiters key.
-- Result: whether it was held, pid.
SELECT pg_advisory_unlock_shared($1::int8), pg_backend_pid()
