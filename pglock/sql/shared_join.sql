-- shared_try.sql for a session whose readers hold the name already, which
-- Postgres grants the key again without looking at its queue: so pg_locks is
-- asked first whether a writer waits there (only then: planning the view
-- costs as much as the rest of the statement).
-- Parameters and result: as shared_try.sql.
SELECT CASE WHEN EXISTS (SELECT 1 FROM pg_locks l
			WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND NOT l.granted AND l.mode = 'ExclusiveLock'
				AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
				AND (l.classid::int8 << 32) | l.objid::int8 = $1::int8) THEN -1
	WHEN pg_try_advisory_xact_lock_shared($4::int8) THEN
		CASE WHEN pg_try_advisory_lock_shared($1::int8) THEN
			CASE WHEN pg_try_advisory_lock($2::int8) THEN
				CASE WHEN pg_advisory_unlock($2::int8) THEN nextval($3::text::regclass) ELSE -3 END
			ELSE -4 END
		ELSE -1 END
	ELSE -1 END, pg_backend_pid()
