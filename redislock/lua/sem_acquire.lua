-- Takes a semaphore permit.
-- KEYS: lock, token, slots, permits, the id's tombstone.
-- ARGV: id, ttl ms, limit, meta JSON, token retention ms.
-- Reply: as mutex_acquire.lua.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
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
  local _, _, tok = string.find(redis.call('HGET', KEYS[4], id) or '0:0:', '^([^:]*):')
  return tok
end
if n > 0 then
  local have = tonumber(redis.call('HGET', KEYS[4], '#limit'))
  if have and have ~= limit then return {-1, string.format('%d', have)} end
  if n >= limit then
    local first = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')
    return {0, tonumber(first[2]) - now}
  end
end
local tok = t[1] .. string.format('%06d', t[2])
local last = tonumber(redis.call('SET', KEYS[2], tok, 'PX', ARGV[5], 'GET'))
if last and last >= tonumber(tok) then
  tok = string.format('%d', redis.call('INCRBY', KEYS[2], string.format('%d', last - tonumber(tok) + 1)))
end
redis.call('ZADD', KEYS[3], string.format('%d', now + ttl), id)
redis.call('HSET', KEYS[4], id, tok .. ':' .. nows .. ':' .. ARGV[4], '#limit', ARGV[3])
keep()
return tok
