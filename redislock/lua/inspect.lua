-- Reads who holds a name. It writes nothing.
-- KEYS: lock, token, slots, permits.
-- Reply: {} | {'1', value, pttl} a mutex | {limit, id, "token:since:meta",
-- ms left, ...} a semaphore's permits or a shared name's readers (limit
-- '1'), followed by the placeholder's value (its queue of writers) if a
-- writer waits for the readers.
local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, 7) ~= 'shared:' then return {'1', v, redis.call('PTTL', KEYS[1])} end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ps = redis.call('ZRANGEBYSCORE', KEYS[3], '(' .. string.format('%d', now), '+inf', 'WITHSCORES')
if #ps == 0 then return {} end
local out = {redis.call('HGET', KEYS[4], '#limit') or '0'}
for i = 1, #ps, 2 do
  out[#out + 1] = ps[i]
  out[#out + 1] = redis.call('HGET', KEYS[4], ps[i]) or '0:0:'
  out[#out + 1] = tonumber(ps[i + 1]) - now
end
if v then out[#out + 1] = v end
return out
