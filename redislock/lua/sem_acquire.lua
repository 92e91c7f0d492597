-- Takes a semaphore permit (after queue.lua).
-- KEYS: lock, token, slots, permits, the id's tombstone, queue, waiters.
-- ARGV: id, ttl ms, limit, meta JSON, token retention ms, the factory's
-- channel if the caller waits ('' if not), queue entry lifetime ms, heard
-- (see wake).
-- Reply: as mutex_acquire.lua.
--
-- Free permits go to the first live waiters in the queue; a waiter that
-- takes one while more are free tells the next.
Q, W = KEYS[6], KEYS[7]
local tok, now = clock()
local nows = string.format('%d', now)

-- sweep drops expired permits and returns how many are left.
local function sweep()
  local gone = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', nows)
  if #gone > 0 then
    redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', nows)
    for i = 1, #gone do redis.call('HDEL', KEYS[4], gone[i]) end
  end
  local n = redis.call('ZCARD', KEYS[3])
  if n == 0 then redis.call('DEL', KEYS[4]) end
  return n
end

-- keep makes the semaphore's keys live exactly as long as its last permit.
local function keep()
  local last = redis.call('ZRANGE', KEYS[3], -1, -1, 'WITHSCORES')
  if #last == 0 then return end
  local ms = string.format('%d', tonumber(last[2]) - now + 1)
  redis.call('PEXPIRE', KEYS[3], ms)
  redis.call('PEXPIRE', KEYS[4], ms)
end

if redis.call('EXISTS', KEYS[5]) == 1 then return {-2, '0'} end
local id, ttl, limit = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
if redis.call('EXISTS', KEYS[1]) == 1 then return {-1, '1'} end
local n = sweep()
if redis.call('ZSCORE', KEYS[3], id) then -- our own acquire, retried
  local _, _, held = string.find(redis.call('HGET', KEYS[4], id) or '0:0:', '^([^:]*):')
  return held
end
if n > 0 then
  local have = tonumber(redis.call('HGET', KEYS[4], '#limit'))
  if have and have ~= limit then return {-1, string.format('%d', have)} end
  if n >= limit then
    queue(id, ARGV[6], tok, now, ARGV[7])
    local first = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')
    return {0, tonumber(first[2]) - now}
  end
end
if ahead(id, now, limit - n) >= limit - n then
  queue(id, ARGV[6], tok, now, ARGV[7])
  return {0, ARGV[7]}
end
dequeue(id)
local last = tonumber(redis.call('SET', KEYS[2], tok, 'PX', ARGV[5], 'GET'))
if last and last >= tonumber(tok) then
  tok = string.format('%d', redis.call('INCRBY', KEYS[2], string.format('%d', last - tonumber(tok) + 1)))
end
redis.call('ZADD', KEYS[3], string.format('%d', now + ttl), id)
redis.call('HSET', KEYS[4], id, tok .. ':' .. nows .. ':' .. ARGV[4], '#limit', ARGV[3])
keep()
if n + 1 < limit then wake(now, ARGV[8]) end
return tok
