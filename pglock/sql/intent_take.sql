-- Takes a name's intent key for a writer waiting by notifications, which
-- readers (shared_try.sql) give way to. Held by another session's writer,
-- it fails, and is tried again at the writer's next attempt.
-- $1 intent key.
-- Result: taken, pid.
SELECT pg_try_advisory_lock($1::int8), pg_backend_pid()
