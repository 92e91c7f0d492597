-- mutex_try.sql, also writing the holder's row, for Inspect and List (a
-- call with an owner or metadata), when the lock was taken. The CTE is
-- referenced twice, so it runs once.
-- $1-$3 as mutex_try.sql, $4 prefix, $5 name, $6 owner, $7 metadata (jsonb,
-- or NULL).
-- Result: as mutex_try.sql.
WITH a AS (SELECT CASE WHEN pg_try_advisory_lock($1::int8) THEN
		CASE WHEN pg_try_advisory_xact_lock($2::int8) THEN nextval($3::text::regclass)
		WHEN pg_advisory_unlock($1::int8) THEN -2 ELSE -3 END
	ELSE -1 END AS token),
i AS (INSERT INTO :"schema".pglock_holders (key, token, ns, name, slot, lim, pid, since, owner, metadata)
	SELECT $1::int8, token, $4::text, $5::text, 0, 1, pg_backend_pid(), now(), $6::text, $7::jsonb FROM a WHERE token > 0)
SELECT token, pg_backend_pid() FROM a
