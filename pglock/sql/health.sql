-- The health check of an idle session: it answers, from the same backend.
-- Result: pid.
SELECT pg_backend_pid()
