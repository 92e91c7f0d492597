-- Gives back the intent key of intent_take.sql.
-- $1 intent key.
-- Result: whether it was held, pid.
SELECT pg_advisory_unlock($1::int8), pg_backend_pid()
