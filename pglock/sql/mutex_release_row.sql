-- mutex_release.sql, also deleting the holder's row.
-- $1, $2 as mutex_release.sql, $3 the holder's token.
-- Result: as mutex_release.sql.
WITH d AS (DELETE FROM :"schema".pglock_holders WHERE key = $1::int8 AND token = $3::int8)
SELECT CASE WHEN pg_advisory_unlock($1::int8) THEN
		CASE WHEN pg_try_advisory_xact_lock($2::int8) THEN 0 ELSE length(pg_notify('pglock', $2::int8::text)::text) END
		+ CASE WHEN pg_try_advisory_xact_lock($1::int8) THEN 1 ELSE 2 END
	ELSE 0 END, pg_backend_pid()
