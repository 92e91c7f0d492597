-- The fence (Fence.RejectIfStale, RejectIfStaleTx): records a token as the
-- key's highest unless a higher one is recorded. The token travels as text:
-- numeric holds the whole uint64 range, which neither a bigint nor a double
-- does.
-- $1 prefix, $2 key, $3 token (text).
-- Result: true, or no row: the token is stale.
INSERT INTO :"schema".pglock_fences AS t (ns, key, token) VALUES ($1::text, $2::text, $3::text::numeric)
	ON CONFLICT (ns, key) DO UPDATE SET token = EXCLUDED.token, updated_at = now()
	WHERE t.token <= EXCLUDED.token
	RETURNING true
