-- Pushes a mutex's expiry one TTL into the future if it is still this
-- holder's.
-- KEYS: lock.
-- ARGV: "<id>:", ttl ms.
-- Reply: 1 extended, 0 not ours.
local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, #ARGV[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
