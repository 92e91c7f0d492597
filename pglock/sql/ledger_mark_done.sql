-- Ledger.MarkDone: records the key as done by a token, unless it is: the
-- first record wins.
-- $1 prefix, $2 key, $3 token (text).
INSERT INTO :"schema".pglock_ledger (ns, key, token) VALUES ($1::text, $2::text, $3::text::numeric)
	ON CONFLICT (ns, key) DO NOTHING
