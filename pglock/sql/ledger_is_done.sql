-- Ledger.IsDone: whether the key is recorded.
-- $1 prefix, $2 key.
-- Result: one boolean.
SELECT EXISTS (SELECT 1 FROM :"schema".pglock_ledger WHERE ns = $1::text AND key = $2::text)
