-- Moves the token counter to a new epoch unless another session just did
-- (see pglock_rebase_v1 in setup.sql); commits on its own.
-- Result: pid.
SELECT pg_backend_pid() FROM :"schema".pglock_rebase_v1()
