-- Removes this holder's permit, if it is still there, takes the id out of
-- the queue, and if a permit is free tells the first waiter (after
-- queue.lua); writes the id's tombstone in any case. Also the cleanup of a
-- failed attempt and of a waiter that gave up.
-- KEYS: lock, token, slots, permits, the id's tombstone, queue, waiters.
-- ARGV: id, tombstone ms, heard (see wake).
-- Reply: 1 released, 0 not ours (lost).
Q, W = KEYS[6], KEYS[7]
local _, now = clock()
local nows = string.format('%d', now)

redis.call('SET', KEYS[5], '1', 'PX', ARGV[2])
dequeue(ARGV[1])
local s = redis.call('ZSCORE', KEYS[3], ARGV[1])
local ok = 0
if s then
  if tonumber(s) > now then ok = 1 end
  redis.call('ZREM', KEYS[3], ARGV[1])
  redis.call('HDEL', KEYS[4], ARGV[1])
end
-- Drop expired permits.
local gone = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', nows)
if #gone > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', nows)
  for i = 1, #gone do redis.call('HDEL', KEYS[4], gone[i]) end
end
local n = redis.call('ZCARD', KEYS[3])
if n == 0 then redis.call('DEL', KEYS[4]) end
if redis.call('EXISTS', Q) == 1 and (n == 0 or n < tonumber(redis.call('HGET', KEYS[4], '#limit') or '0')) then
  wake(now, ARGV[3])
end
return ok
