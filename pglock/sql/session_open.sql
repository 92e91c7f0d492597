-- The first statement of a lock session (in the simple protocol: the
-- server is not known yet): names it for operators.
-- $1 application_name.
-- Result: pid, synchronous_commit, the application_name, version().
SELECT pg_backend_pid(), current_setting('synchronous_commit'), set_config('application_name', $1::text, false), version()
