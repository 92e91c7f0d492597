-- Pushes this holder's permit one TTL into the future, if it is still
-- there, and makes the semaphore's keys live as long as its last permit.
-- KEYS: lock, permits.
-- ARGV: id, ttl ms.
-- Reply: 1 extended, 0 not ours (lost).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local s = redis.pcall('ZSCORE', KEYS[1], ARGV[1])
if type(s) ~= 'string' or tonumber(s) <= now then return 0 end
redis.call('ZADD', KEYS[1], 'XX', string.format('%d', now + tonumber(ARGV[2])), ARGV[1])
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
local ms = string.format('%d', tonumber(last[2]) - now + 1)
redis.call('PEXPIRE', KEYS[1], ms)
redis.call('PEXPIRE', KEYS[2], ms)
return 1
