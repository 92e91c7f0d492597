-- shared_try.sql, also writing the holder's row as mutex_try_row.sql does.
-- $1-$4 as shared_try.sql, $5 prefix, $6 name, $7 owner, $8 metadata.
-- Result: as shared_try.sql.
WITH a AS (SELECT CASE WHEN pg_try_advisory_xact_lock_shared($4::int8) THEN
		CASE WHEN pg_try_advisory_lock_shared($1::int8) THEN
			CASE WHEN pg_try_advisory_lock($2::int8) THEN
				CASE WHEN pg_advisory_unlock($2::int8) THEN nextval($3::text::regclass) ELSE -3 END
			ELSE -4 END
		ELSE -1 END
	ELSE -1 END AS token),
i AS (INSERT INTO :"schema".pglock_holders (key, token, ns, name, slot, lim, pid, since, owner, metadata)
	SELECT $1::int8, token, $5::text, $6::text, 0, 1, pg_backend_pid(), now(), $7::text, $8::jsonb FROM a WHERE token > 0)
SELECT token, pg_backend_pid() FROM a
