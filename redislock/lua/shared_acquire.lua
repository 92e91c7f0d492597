-- Takes a name shared (WithShared): the caller joins its readers, kept in
-- the lock key as a sorted set of reader ids scored by expiry (server ms),
-- like a semaphore's permits (sem_acquire.lua), with '#limit' '1' in the
-- permits hash (no semaphore has limit 1).
-- KEYS: lock, token, the factory's seen mark, permits, queue.
-- ARGV: id, ttl ms, meta JSON, token retention ms, '1' if the caller
-- waits, the request's number.
-- Reply: as mutex_acquire.lua.
--
-- A reader is turned away while a writer holds the name (the lock is a
-- mutex's string) and while writers queue behind the readers (writer
-- preference, see mutex_acquire.lua). A waiting reader marks that it
-- waits, with the 'r' flag on the writer's value or '#r' in the permits
-- hash, so that the release that frees the name announces it on the
-- name's channel (mutex_release.lua); it looks again within its TTL in
-- any case. Tokens are drawn, and the seen mark raised, as
-- mutex_acquire.lua does.
local id, ttl = ARGV[1], tonumber(ARGV[2])
local wait = ARGV[5] == '1'
local ty = redis.call('TYPE', KEYS[1]).ok
if ty == 'string' then
  if wait then
    local v = redis.call('GET', KEYS[1])
    local nl = string.find(v, '\n', 1, true)
    if not (nl and string.find(v, 'r', nl + 1, true)) then redis.call('APPEND', KEYS[1], nl and 'r' or '\nr') end
  end
  local left = redis.call('PTTL', KEYS[1])
  if left < 0 or left > ttl then left = ttl end
  return {0, left}
end

local function draw()
  local n = redis.pcall('INCR', KEYS[2])
  if type(n) == 'table' then
    if not string.find(n.err, 'not an integer', 1, true) then error(n) end
    n = 0
  end
  if n >= 1e15 then return string.format('%d', n) end
  local t = redis.call('TIME')
  local tok = t[1] .. string.sub('00000' .. t[2], -6)
  redis.call('SET', KEYS[2], tok, 'PX', ARGV[4])
  return tok
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local nows = string.format('%d', now)
local last = now + ttl
if ty == 'zset' then
  local gone = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', nows)
  if #gone > 0 then
    redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', nows)
    for i = 1, #gone do redis.call('HDEL', KEYS[4], gone[i]) end
  end
  if redis.call('ZSCORE', KEYS[1], id) then -- our own acquire, retried
    local _, _, tok = string.find(redis.call('HGET', KEYS[4], id) or '0:0:', '^([^:]*):')
    return tok
  end
  local top = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
  if top[2] then
    local have = redis.call('HGET', KEYS[4], '#limit') or '0'
    if have ~= '1' then return {-1, have} end
    if redis.call('EXISTS', KEYS[5]) == 1 then -- writers queue behind the readers
      if wait then redis.call('HSET', KEYS[4], '#r', '1') end
      return {0, ttl}
    end
    last = math.max(last, tonumber(top[2]))
  else
    redis.call('DEL', KEYS[4])
  end
end
local tok = draw()
local old = redis.call('SET', KEYS[3], ARGV[6], 'PX', 2 * ttl, 'GET')
if old and (tonumber(old) or 0) >= tonumber(ARGV[6]) then
  redis.call('SET', KEYS[3], old, 'PX', 2 * ttl)
  return {-3, '0'}
end
redis.call('ZADD', KEYS[1], string.format('%d', now + ttl), id)
redis.call('HSET', KEYS[4], id, tok .. ':' .. nows .. ':' .. ARGV[3], '#limit', '1')
local ms = string.format('%d', last - now + 1)
redis.call('PEXPIRE', KEYS[1], ms)
redis.call('PEXPIRE', KEYS[4], ms)
return tok
