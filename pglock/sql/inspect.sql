-- The held keys of a name, with their holder rows and the sessions'
-- pg_stat_activity entries. Only readers (WithShared) hold a mutex key
-- shared: a session's readers are one row of pg_locks, shown with the
-- newest reader's holder row.
-- $1 the keys: the mutex key and a semaphore's permit keys (int8[]).
-- Result per holding session: key, pid, token, since, owner, metadata
-- (text), application_name, client address (NULL where unknown).
SELECT (l.classid::int8 << 32) | l.objid::int8 AS key, l.pid,
		h.token, h.since, h.owner, h.metadata::text,
		a.application_name, host(a.client_addr)
	FROM pg_locks l
	LEFT JOIN LATERAL (SELECT * FROM :"schema".pglock_holders h
		WHERE h.key = (l.classid::int8 << 32) | l.objid::int8 AND h.pid = l.pid
		ORDER BY h.token DESC LIMIT 1) h ON true
	LEFT JOIN pg_stat_activity a ON a.pid = l.pid
	WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted AND l.mode IN ('ExclusiveLock', 'ShareLock')
		AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
		AND (l.classid::int8 << 32) | l.objid::int8 = ANY($1::int8[])
