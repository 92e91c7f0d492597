-- Reads who holds a name. It writes nothing.
-- KEYS: lock, permits, queue.
-- Reply: {} | {'m', value, pttl, waiting} a mutex | {limit, waiting, id,
-- "token:since:meta", ms left, ...} a semaphore's permits or a shared
-- name's readers (limit '1'; waiting: the writers queued behind them, 0
-- for a semaphore).
local v = redis.pcall('GET', KEYS[1])
if not v then return {} end
if type(v) == 'string' then return {'m', v, redis.call('PTTL', KEYS[1]), redis.call('LLEN', KEYS[3])} end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ps = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. string.format('%d', now), '+inf', 'WITHSCORES')
if #ps == 0 then return {} end
local limit = redis.call('HGET', KEYS[2], '#limit') or '0'
local out = {limit, 0}
if limit == '1' then out[2] = redis.call('LLEN', KEYS[3]) end
for i = 1, #ps, 2 do
  out[#out + 1] = ps[i]
  out[#out + 1] = redis.call('HGET', KEYS[2], ps[i]) or '0:0:'
  out[#out + 1] = tonumber(ps[i + 1]) - now
end
return out
