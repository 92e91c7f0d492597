-- The committed token epoch (0: none yet).
-- Result: epoch, pid.
SELECT coalesce((SELECT e FROM :"schema".pglock_epoch), 0), pg_backend_pid()
