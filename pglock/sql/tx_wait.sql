-- tx_try.sql, waiting in Postgres's queue of the key (pg_advisory_xact_lock
-- returns void: the length of its text is 0).
-- Parameters and result: as tx_try.sql (never -1).
SELECT CASE WHEN length(pg_advisory_xact_lock($1::int8)::text) = 0 THEN
		CASE WHEN NOT pg_try_advisory_lock($2::int8) THEN -2
		WHEN pg_advisory_unlock($2::int8) THEN nextval($3::text::regclass) ELSE -3 END
	ELSE -1 END, pg_backend_pid()
