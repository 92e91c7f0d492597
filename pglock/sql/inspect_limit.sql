-- The stored limit of a semaphore, with the name its row belongs to.
-- $1 limits row key.
-- Result: lim, ns, name (no row: not a semaphore).
SELECT lim, ns, name FROM :"schema".pglock_limits WHERE key = $1::int8
