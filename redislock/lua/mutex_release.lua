-- Deletes a mutex if it is still this holder's, takes the id out of the
-- queue, and if the name is free tells the first waiter (after queue.lua);
-- writes the id's tombstone in any case. Also the cleanup of a failed
-- attempt and of a waiter that gave up.
-- KEYS: lock, the id's tombstone, queue, waiters.
-- ARGV: "<id>:", tombstone ms, heard (see wake).
-- Reply: 1 released, 0 not ours.
Q, W = KEYS[3], KEYS[4]
redis.call('SET', KEYS[2], '1', 'PX', ARGV[2])
dequeue(string.sub(ARGV[1], 1, -2))
local v = redis.call('GET', KEYS[1])
local ok = 0
if v and string.sub(v, 1, #ARGV[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  v, ok = nil, 1
end
if not v and redis.call('EXISTS', Q) == 1 then
  local _, now = clock()
  wake(now, ARGV[3])
end
return ok
