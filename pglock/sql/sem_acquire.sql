-- Takes a semaphore permit at once or not at all (see
-- pglock_sem_acquire_v3 in setup.sql), writing the holder's row if it has
-- an owner or metadata.
-- $1 permit keys (int8[]), $2 their slots (int4[]), $3 the semaphore marker
-- key, $4 whether to take the marker (the session holds none for the name),
-- $5 mutex key, $6 limits row key, $7 limit, $8 prefix, $9 name, $10 owner,
-- $11 metadata (jsonb, or NULL).
-- Result: slot, token, stored (the limit in force), pid, status (0 taken,
-- 1 busy, 2 another limit is stored, 3 the limits row is another name's,
-- 4 the mutex of the name is held, 5 the name is held shared).
SELECT slot, token, stored, pid, status FROM :"schema".pglock_sem_acquire_v3($1::int8[], $2::int4[], $3::int8, $4::bool,
	$5::int8, $6::int8, $7::int4, $8::text, $9::text, $10::text <> '' OR $11::jsonb IS NOT NULL, $10::text, $11::jsonb)
