-- Takes a name shared (WithShared): the caller joins its readers, a sorted
-- set of reader ids scored by expiry like a semaphore's permits, with
-- '#limit' '1' in the permits hash (no semaphore has limit 1).
-- KEYS: lock, token, slots, permits, the id's tombstone, the
-- readers-waiting marker.
-- ARGV: id, ttl ms, meta JSON, token retention ms, '1' if the caller
-- waits.
-- Reply: as mutex_acquire.lua.
--
-- While the lock key exists (an exclusive holder, or the placeholder of a
-- writer waiting for the readers, see mutex_acquire.lua) the reader is
-- turned away: writer preference. A waiting reader then sets the marker,
-- for two of its TTLs, so that the release that frees the name publishes
-- on the name's channel (mutex_release.lua); it looks again within its
-- TTL in any case. Tokens are drawn like a free mutex's: one above the
-- counter, never below the server clock in microseconds.
if redis.call('EXISTS', KEYS[5]) == 1 then return {-2, '0'} end
local ttl = tonumber(ARGV[2])
local v = redis.call('PTTL', KEYS[1])
if v ~= -2 then
  if ARGV[5] == '1' then redis.call('SET', KEYS[6], '1', 'PX', string.format('%d', 2 * ttl)) end
  if v < 0 or v > ttl then v = ttl end
  return {0, v}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local nows = string.format('%d', now)
local gone = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', nows)
if #gone > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', nows)
  for i = 1, #gone do redis.call('HDEL', KEYS[4], gone[i]) end
end
local id = ARGV[1]
if redis.call('ZSCORE', KEYS[3], id) then -- our own acquire, retried
  local _, _, tok = string.find(redis.call('HGET', KEYS[4], id) or '0:0:', '^([^:]*):')
  return tok
end
if redis.call('ZCARD', KEYS[3]) > 0 then
  local have = redis.call('HGET', KEYS[4], '#limit') or '0'
  if have ~= '1' then return {-1, have} end
end
local tok = t[1] .. string.format('%06d', t[2])
local last = tonumber(redis.call('SET', KEYS[2], tok, 'PX', ARGV[4], 'GET'))
if last and last >= tonumber(tok) then
  tok = string.format('%d', redis.call('INCRBY', KEYS[2], string.format('%d', last - tonumber(tok) + 1)))
end
redis.call('ZADD', KEYS[3], string.format('%d', now + ttl), id)
redis.call('HSET', KEYS[4], id, tok .. ':' .. nows .. ':' .. ARGV[3], '#limit', '1')
local top = redis.call('ZRANGE', KEYS[3], -1, -1, 'WITHSCORES')
local ms = string.format('%d', tonumber(top[2]) - now + 1)
redis.call('PEXPIRE', KEYS[3], ms)
redis.call('PEXPIRE', KEYS[4], ms)
return tok
