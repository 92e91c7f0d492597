-- Gives a holder's row the token that replaced an out-of-range value.
-- $1 key, $2 the value the row has, $3 the token.
UPDATE :"schema".pglock_holders SET token = $3::int8 WHERE key = $1::int8 AND token = $2::int8 AND pid = pg_backend_pid()
