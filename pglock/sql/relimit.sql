-- Sets the stored limit of a semaphore while nobody holds a permit (see
-- pglock_relimit_v1 in setup.sql).
-- $1 the permit keys of the old and the new limit (int8[]), $2 limits row
-- key, $3 limit, $4 prefix, $5 name.
-- Result: done (0 permits are held, 1 done, 3 the row is another name's), pid.
SELECT :"schema".pglock_relimit_v1($1::int8[], $2::int8, $3::int4, $4::text, $5::text), pg_backend_pid()
