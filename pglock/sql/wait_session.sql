-- Prepares a new wait session, whose pg_advisory_lock may wait for long
-- without a byte in either direction: no statement or lock timeout (the
-- wait is bounded by the caller), and Postgres checks every $1 ms that the
-- client is still there (client_connection_check_interval, PostgreSQL 14
-- and later), so that a killed waiter leaves the queue then, not only when
-- its turn comes. Nor may idle_session_timeout end it between waits.
-- $1 the check interval in milliseconds (text).
SELECT set_config('statement_timeout', '0', false), set_config('lock_timeout', '0', false),
	(SELECT set_config(name, $1::text, false) FROM pg_settings WHERE name = 'client_connection_check_interval'),
	(SELECT set_config(name, '0', false) FROM pg_settings WHERE name = 'idle_session_timeout')
