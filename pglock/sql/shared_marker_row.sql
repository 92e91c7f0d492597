-- shared_marker.sql, also writing the holder's row as mutex_try_row.sql
-- does.
-- $1-$3 as mutex_try.sql, $4 prefix, $5 name, $6 owner, $7 metadata.
-- Result: as shared_marker.sql.
WITH a AS (SELECT CASE WHEN pg_try_advisory_lock($2::int8) THEN
		CASE WHEN pg_advisory_unlock($2::int8) THEN nextval($3::text::regclass) ELSE -3 END
	WHEN NOT EXISTS (SELECT 1 FROM pg_locks l
		WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted AND l.mode = 'ShareLock'
			AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
			AND (l.classid::int8 << 32) | l.objid::int8 = $2::int8) THEN nextval($3::text::regclass)
	WHEN pg_advisory_unlock_shared($1::int8) THEN -2 ELSE -3 END AS token),
i AS (INSERT INTO :"schema".pglock_holders (key, token, ns, name, slot, lim, pid, since, owner, metadata)
	SELECT $1::int8, token, $4::text, $5::text, 0, 1, pg_backend_pid(), now(), $6::text, $7::jsonb FROM a WHERE token > 0)
SELECT token, pg_backend_pid() FROM a
