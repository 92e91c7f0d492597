-- Removes this holder's permit, if it is still there, and wakes waiters
-- (also when it dropped expired permits); writes the id's tombstone in any
-- case.
-- KEYS: lock, token, slots, permits, the id's tombstone.
-- ARGV: id, channel, tombstone ms.
-- Reply: 1 released, 0 not ours (lost).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local nows = string.format('%d', now)

redis.call('SET', KEYS[5], '1', 'PX', ARGV[3])
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
if redis.call('ZCARD', KEYS[3]) == 0 then redis.call('DEL', KEYS[4]) end
if s or #gone > 0 then redis.call('PUBLISH', ARGV[2], 'r') end
return ok
