-- mutex_wait.sql, also writing the holder's row as mutex_try_row.sql does.
-- Parameters: as mutex_try_row.sql.
-- Result: as mutex_wait.sql.
WITH a AS (SELECT CASE WHEN pg_try_advisory_lock($1::int8) THEN
		CASE WHEN pg_try_advisory_xact_lock($2::int8) THEN nextval($3::text::regclass)
		WHEN pg_advisory_unlock($1::int8) THEN -2 ELSE -3 END
	WHEN length(pg_advisory_lock($1::int8)::text) = 0 THEN
		CASE WHEN pg_try_advisory_xact_lock($2::int8) THEN -nextval($3::text::regclass)
		WHEN pg_advisory_unlock($1::int8) THEN -2 ELSE -3 END
	END AS token),
i AS (INSERT INTO :"schema".pglock_holders (key, token, ns, name, slot, lim, pid, since, owner, metadata)
	SELECT $1::int8, abs(token), $4::text, $5::text, 0, 1, pg_backend_pid(), now(), $6::text, $7::jsonb FROM a WHERE token > 0 OR token < -4)
SELECT token, pg_backend_pid() FROM a
