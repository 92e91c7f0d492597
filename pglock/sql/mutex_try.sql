-- Takes a mutex at once or not at all, with its token. The mutex key
-- first; then, only if it was taken, the check that no other session holds
-- a permit of a semaphore of the same name (its marker key, held shared),
-- then the token counter: CASE evaluates in order.
-- $1 mutex key, $2 semaphore marker key, $3 the token counter (regclass as
-- text).
-- Result: token (> 0 taken: the counter's value, which the factory checks
-- against the epoch; -1 held; -2 a semaphore of the name is held; -3 the
-- key was not held for the unlock after a failed check), pid.
SELECT CASE WHEN pg_try_advisory_lock($1::int8) THEN
		CASE WHEN pg_try_advisory_xact_lock($2::int8) THEN nextval($3::text::regclass)
		WHEN pg_advisory_unlock($1::int8) THEN -2 ELSE -3 END
	ELSE -1 END, pg_backend_pid()
