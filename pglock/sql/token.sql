-- A new counter value in the committed epoch's range, or -4 (see
-- pglock_token_v1 in setup.sql).
-- Result: token, epoch, pid.
SELECT token, epoch, pg_backend_pid() FROM :"schema".pglock_token_v1()
