-- Deletes the holder rows of sessions that ended (Inspect ignores them
-- anyway), when a lock session opens.
DELETE FROM :"schema".pglock_holders h WHERE NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = h.pid)
