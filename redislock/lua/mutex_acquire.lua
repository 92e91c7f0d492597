-- Takes a mutex (after queue.lua).
-- KEYS: lock, token, slots, permits, the id's tombstone, queue, waiters.
-- ARGV: "<id>:", ttl ms, meta JSON, token retention ms, the factory's
-- channel if the caller waits ('' if not), queue entry lifetime ms.
-- Reply: the token (a string) | {0, ms until the holder's lease ends, or
-- until the waiter ahead would be taken for gone} | {-1, the semaphore
-- limit in force} | {-2, '0'} the id was given up.
--
-- A free name goes to the first live waiter in the queue; others that wait
-- join the queue (or keep their place) and are told when their turn comes
-- (see wake in queue.lua).
--
-- Tokens: one more than the last, but never below the server clock in
-- microseconds, so a token counter that was lost (a restart without
-- persistence, eviction, expiry) never restarts low. In the rare case that
-- the counter is ahead of the clock (two acquires in one microsecond, or the
-- server clock stepped back) the token is raised and the value set again,
-- within the same atomic script. If the counter write fails (a key of the
-- wrong type) the script stops with the lock set: the client then removes
-- it by its id, as after any failed acquire.
Q, W = KEYS[6], KEYS[7]
if redis.call('EXISTS', KEYS[5]) == 1 then return {-2, '0'} end
local tok, now = clock()
local since = string.format('%d', now)
local id = string.sub(ARGV[1], 1, -2)
if redis.call('EXISTS', KEYS[3]) == 1 then -- a semaphore of the same name?
  local gone = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', since)
  for i = 1, #gone do redis.call('HDEL', KEYS[4], gone[i]) end
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', since)
  if redis.call('ZCARD', KEYS[3]) > 0 then
    return {-1, redis.call('HGET', KEYS[4], '#limit') or '0'}
  end
  redis.call('DEL', KEYS[4])
end
local v = redis.call('GET', KEYS[1])
if v then
  if string.sub(v, 1, #ARGV[1]) == ARGV[1] then -- our own acquire, retried by the client
    local _, _, held = string.find(v, '^[^:]*:([^:]*):')
    return held
  end
  queue(id, ARGV[5], tok, now, ARGV[6])
  return {0, redis.call('PTTL', KEYS[1])}
end
if ahead(id, now, 1) > 0 then
  queue(id, ARGV[5], tok, now, ARGV[6])
  return {0, ARGV[6]}
end
dequeue(id)
redis.call('SET', KEYS[1], ARGV[1] .. tok .. ':' .. since .. ':' .. ARGV[3], 'PX', ARGV[2])
local last = tonumber(redis.call('SET', KEYS[2], tok, 'PX', ARGV[4], 'GET'))
if last and last >= tonumber(tok) then
  tok = string.format('%d', redis.call('INCRBY', KEYS[2], string.format('%d', last - tonumber(tok) + 1)))
  redis.call('SET', KEYS[1], ARGV[1] .. tok .. ':' .. since .. ':' .. ARGV[3], 'PX', ARGV[2])
end
return tok
