-- The token a fence holds for a key, for the message of a stale one.
-- $1 prefix, $2 key.
-- Result: token (text).
SELECT token::text FROM :"schema".pglock_fences WHERE ns = $1::text AND key = $2::text
