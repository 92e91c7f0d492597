-- shared_wait.sql, also writing the holder's row as mutex_try_row.sql does.
-- Parameters: as shared_try_row.sql.
-- Result: as shared_wait.sql.
WITH a AS (SELECT CASE WHEN NOT pg_try_advisory_lock_shared($4::int8) THEN -1
	WHEN NOT pg_advisory_unlock_shared($4::int8) THEN -3
	WHEN pg_try_advisory_lock_shared($1::int8) THEN
		CASE WHEN pg_try_advisory_lock($2::int8) THEN
			CASE WHEN pg_advisory_unlock($2::int8) THEN nextval($3::text::regclass) ELSE -3 END
		ELSE -4 END
	WHEN length(pg_advisory_lock_shared($1::int8)::text) = 0 THEN
		CASE WHEN pg_try_advisory_lock($2::int8) THEN
			CASE WHEN pg_advisory_unlock($2::int8) THEN -nextval($3::text::regclass) ELSE -3 END
		ELSE -4 END
	END AS token),
i AS (INSERT INTO :"schema".pglock_holders (key, token, ns, name, slot, lim, pid, since, owner, metadata)
	SELECT $1::int8, abs(token), $5::text, $6::text, 0, 1, pg_backend_pid(), now(), $7::text, $8::jsonb FROM a WHERE token > 0 OR token < -4)
SELECT token, pg_backend_pid() FROM a
