-- Gives up keys that an attempt took for a holder that is not to be (after
-- a failure), with the rows written for them: the keys ($1) and a semaphore
-- marker held shared ($2, if $3).
-- Result: one row per unlock.
WITH d AS (DELETE FROM :"schema".pglock_holders WHERE key = ANY($1::int8[]) AND pid = pg_backend_pid())
SELECT pg_advisory_unlock(k) FROM unnest($1::int8[]) k
UNION ALL SELECT pg_advisory_unlock_shared($2::int8) WHERE $3::bool
