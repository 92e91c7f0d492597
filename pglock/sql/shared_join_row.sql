-- shared_join.sql, also writing the holder's row as mutex_try_row.sql does.
-- Parameters and result: as shared_try_row.sql.
WITH a AS (SELECT CASE WHEN EXISTS (SELECT 1 FROM pg_locks l
			WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND NOT l.granted AND l.mode = 'ExclusiveLock'
				AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
				AND (l.classid::int8 << 32) | l.objid::int8 = $1::int8) THEN -1
	WHEN pg_try_advisory_xact_lock_shared($4::int8) THEN
		CASE WHEN pg_try_advisory_lock_shared($1::int8) THEN
			CASE WHEN pg_try_advisory_lock($2::int8) THEN
				CASE WHEN pg_advisory_unlock($2::int8) THEN nextval($3::text::regclass) ELSE -3 END
			ELSE -4 END
		ELSE -1 END
	ELSE -1 END AS token),
i AS (INSERT INTO :"schema".pglock_holders (key, token, ns, name, slot, lim, pid, since, owner, metadata)
	SELECT $1::int8, token, $5::text, $6::text, 0, 1, pg_backend_pid(), now(), $7::text, $8::jsonb FROM a WHERE token > 0)
SELECT token, pg_backend_pid() FROM a
