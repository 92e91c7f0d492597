-- Removes this holder's permit, if it is still there, and wakes waiters
-- (also when it dropped expired permits); raises the factory's seen mark
-- if asked (see mutex_release.lua).
-- KEYS: lock, the factory's seen mark, permits.
-- ARGV: id, channel, the number to raise the mark to ('' for none) and
-- for how many ms.
-- Reply: 1 released, 0 not ours (lost).
if ARGV[3] ~= '' then
  local old = tonumber(redis.call('GET', KEYS[2]) or '0') or 0
  if old < tonumber(ARGV[3]) or redis.call('PTTL', KEYS[2]) < tonumber(ARGV[4]) then
    redis.call('SET', KEYS[2], string.format('%d', math.max(old, tonumber(ARGV[3]))), 'PX', ARGV[4])
  end
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local nows = string.format('%d', now)

local s = redis.pcall('ZSCORE', KEYS[1], ARGV[1])
if type(s) == 'table' then return 0 end -- a mutex holds the name now
local ok = 0
if s then
  if tonumber(s) > now then ok = 1 end
  redis.call('ZREM', KEYS[1], ARGV[1])
  redis.call('HDEL', KEYS[3], ARGV[1])
end
-- Drop expired permits.
local gone = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', nows)
if #gone > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', nows)
  for i = 1, #gone do redis.call('HDEL', KEYS[3], gone[i]) end
end
if redis.call('EXISTS', KEYS[1]) == 0 then redis.call('DEL', KEYS[3]) end
if s or #gone > 0 then redis.call('PUBLISH', ARGV[2], 'r') end
return ok
