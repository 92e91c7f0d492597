-- Pushes a mutex's expiry one TTL into the future if it is still this
-- holder's.
-- KEYS: lock.
-- ARGV: "<id>:", ttl ms.
-- Reply: 1 extended, 0 not ours (also when the lock is now another
-- kind's sorted set of permits).
local v = redis.pcall('GET', KEYS[1])
if type(v) == 'string' and string.sub(v, 1, #ARGV[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
