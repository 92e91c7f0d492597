-- The first statement of a lock session (in the simple protocol: the
-- server is not known yet): names it for operators, and keeps a server's
-- idle_session_timeout (PostgreSQL 14 and later) from ending it between
-- statements, with the locks it holds: the health check, not the server,
-- says when it is gone.
-- $1 application_name.
-- Result: pid, synchronous_commit, the application_name, version(), and
-- '0' (NULL before PostgreSQL 14).
SELECT pg_backend_pid(), current_setting('synchronous_commit'), set_config('application_name', $1::text, false), version(),
	(SELECT set_config(name, '0', false) FROM pg_settings WHERE name = 'idle_session_timeout')
