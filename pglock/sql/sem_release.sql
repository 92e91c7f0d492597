-- Releases a semaphore permit (see pglock_sem_release_v1 in setup.sql).
-- $1 permit key, $2 semaphore marker key, $3 whether to give the marker
-- back (the session's last permit of the name), $4 waiters key, $5 the
-- waiters key in decimal (the notification's payload), $6 the token of the
-- holder's row (NULL: it has none).
-- Result: ok (the session held the permit), pid.
SELECT ok, pid FROM :"schema".pglock_sem_release_v1($1::int8, $2::int8, $3::bool, $4::int8, $5::text, $6::int8)
