-- Takes a mutex in the caller's transaction (AcquireInTx): the mutex key as
-- a transaction lock, then the semaphore check on the marker key as a
-- session lock given back in the same expression (a transaction lock on it
-- would stall semaphore acquirers until the transaction ends), then the
-- counter. After -2 the transaction keeps the mutex key, which it cannot
-- give back, until it ends. No row is written: it would become visible
-- only at the commit that ends the lock.
-- $1 mutex key, $2 semaphore marker key, $3 the token counter (regclass as
-- text).
-- Result: token (as mutex_try.sql), pid.
SELECT CASE WHEN pg_try_advisory_xact_lock($1::int8) THEN
		CASE WHEN NOT pg_try_advisory_lock($2::int8) THEN -2
		WHEN pg_advisory_unlock($2::int8) THEN nextval($3::text::regclass) ELSE -3 END
	ELSE -1 END, pg_backend_pid()
