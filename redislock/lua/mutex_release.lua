-- Deletes a mutex if it is still this holder's, and wakes waiters; writes
-- the id's tombstone in any case.
-- KEYS: lock, the id's tombstone.
-- ARGV: "<id>:", channel, tombstone ms.
-- Reply: 1 released, 0 not ours.
redis.call('SET', KEYS[2], '1', 'PX', ARGV[3])
local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, #ARGV[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], 'r')
  return 1
end
return 0
