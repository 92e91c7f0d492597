-- Takes a mutex.
-- KEYS: lock, token, slots, permits, the id's tombstone.
-- ARGV: "<id>:", ttl ms, meta JSON, token retention ms.
-- Reply: the token (a string) | {0, ms until the holder's lease ends} |
-- {-1, the semaphore limit in force} | {-2, '0'} the id was given up.
--
-- Tokens: one more than the last, but never below the server clock in
-- microseconds, so a token counter that was lost (a restart without
-- persistence, eviction, expiry) never restarts low.
--
-- On a free name it makes EXISTS (the tombstone), TIME, EXISTS (a
-- semaphore), SET NX and the counter's SET GET. The lock is set with the
-- clock token before the counter is read; in the rare case that the counter
-- is ahead of the clock (two acquires in one microsecond, or the server
-- clock stepped back) the token is raised and the value set again, within
-- the same atomic script. If the counter write fails (a key of the wrong
-- type) the script stops with the lock set: the client then removes it by
-- its id, as after any failed acquire.
if redis.call('EXISTS', KEYS[5]) == 1 then return {-2, '0'} end
local t = redis.call('TIME')
local tok = t[1] .. string.sub('00000' .. t[2], -6)
if redis.call('EXISTS', KEYS[3]) == 1 then -- a semaphore of the same name?
  local now = string.sub(tok, 1, -4)
  local gone = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now)
  for i = 1, #gone do redis.call('HDEL', KEYS[4], gone[i]) end
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
  if redis.call('ZCARD', KEYS[3]) > 0 then
    return {-1, redis.call('HGET', KEYS[4], '#limit') or '0'}
  end
  redis.call('DEL', KEYS[4])
end
local since = string.sub(tok, 1, -4)
if not redis.call('SET', KEYS[1], ARGV[1] .. tok .. ':' .. since .. ':' .. ARGV[3], 'NX', 'PX', ARGV[2]) then
  local v = redis.call('GET', KEYS[1])
  if v and string.sub(v, 1, #ARGV[1]) == ARGV[1] then -- our own acquire, retried by the client
    local _, _, held = string.find(v, '^[^:]*:([^:]*):')
    return held
  end
  return {0, redis.call('PTTL', KEYS[1])}
end
local last = tonumber(redis.call('SET', KEYS[2], tok, 'PX', ARGV[4], 'GET'))
if last and last >= tonumber(tok) then
  tok = string.format('%d', redis.call('INCRBY', KEYS[2], string.format('%d', last - tonumber(tok) + 1)))
  redis.call('SET', KEYS[1], ARGV[1] .. tok .. ':' .. since .. ':' .. ARGV[3], 'PX', ARGV[2])
end
return tok
