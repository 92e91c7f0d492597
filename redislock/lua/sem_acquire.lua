-- Takes a semaphore permit. The lock key is the sorted set of the permit
-- ids, scored by expiry (server ms); the permits hash holds each one's
-- "token:since:meta" and '#limit' the limit. Both live as long as the
-- last permit.
-- KEYS: lock, token, the factory's seen mark, permits.
-- ARGV: id, ttl ms, limit, meta JSON, token retention ms, the request's
-- number.
-- Reply: as mutex_acquire.lua. Tokens are drawn, and the seen mark
-- raised, as there.
local ty = redis.call('TYPE', KEYS[1]).ok
if ty == 'string' then return {-1, '1'} end -- a mutex, or a shared name's writer
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local nows = string.format('%d', now)
local id, ttl, limit = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])

local function draw()
  local n = redis.pcall('INCR', KEYS[2])
  if type(n) == 'table' then
    if not string.find(n.err, 'not an integer', 1, true) then error(n) end
    n = 0
  end
  if n >= 1e15 then return string.format('%d', n) end
  local tok = t[1] .. string.sub('00000' .. t[2], -6)
  redis.call('SET', KEYS[2], tok, 'PX', ARGV[5])
  return tok
end

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
  local n = redis.call('ZCARD', KEYS[1])
  if n > 0 then
    local have = tonumber(redis.call('HGET', KEYS[4], '#limit'))
    if have and have ~= limit then return {-1, string.format('%d', have)} end
    if n >= limit then
      local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
      return {0, tonumber(first[2]) - now}
    end
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
redis.call('HSET', KEYS[4], id, tok .. ':' .. nows .. ':' .. ARGV[4], '#limit', ARGV[3])
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
local ms = string.format('%d', tonumber(last[2]) - now + 1)
redis.call('PEXPIRE', KEYS[1], ms)
redis.call('PEXPIRE', KEYS[4], ms)
return tok
