-- Takes a mutex, or puts a waiter in its queue.
-- KEYS: lock, token, slots, permits, the id's tombstone.
-- ARGV: "<id>:", ttl ms, meta JSON, token retention ms, the waiting
-- factory's channel ('' if the caller does not join the queue).
-- Reply: the token (a string) | {0, ms: when to look again} |
-- {-1, the semaphore limit in force} | {-2, '0'} the id was given up.
--
-- The queue of a held mutex is kept in its value, after the holder:
-- "id:token:since:meta" then, per waiter in arrival order,
-- "\n<id>:<ttl ms>:<channel length>:<channel><meta>". It lives and ends
-- with the lease (APPEND and the renewals keep the key's expiry), and a
-- release hands the name to the first waiter (mutex_release.lua).
--
-- Held: "ours" (the value starts with the id: a release granted it to
-- this waiter, or the client retried this acquire) renews the lease and
-- returns the token. Otherwise a waiter joins the queue (one APPEND; the
-- reply says look again within one TTL), or, already queued, is told the
-- holder's lease left. The tombstone is not checked here: a copy of a
-- given-up attempt that queues is granted the name and released again by
-- its factory (see wait.go), or skipped if nobody listens.
--
-- Free: tokens are one more than the last, but never below the server
-- clock in microseconds, so a token counter that was lost (a restart
-- without persistence, eviction, expiry) never restarts low. In the rare
-- case that the counter is ahead of the clock (two acquires in one
-- microsecond, the server clock stepped back, a chain of hand-offs) the
-- token is raised and the value set again, within the same atomic script.
-- If the counter write fails (a key of the wrong type) the script stops
-- with the lock set: the client then removes it by its id, as after any
-- failed acquire.
local v = redis.call('GET', KEYS[1])
if v then
  local id = ARGV[1]
  if string.sub(v, 1, #id) == id then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    local _, _, held = string.find(v, '^[^:]*:([^:]*):')
    return held
  end
  if ARGV[5] == '' or string.find(v, '\n' .. id, 1, true) then
    return {0, redis.call('PTTL', KEYS[1])}
  end
  redis.call('APPEND', KEYS[1], '\n' .. id .. ARGV[2] .. ':' .. #ARGV[5] .. ':' .. ARGV[5] .. ARGV[3])
  return {0, ARGV[2]}
end
if redis.call('EXISTS', KEYS[5]) == 1 then return {-2, '0'} end
local t = redis.call('TIME')
local tok = t[1] .. string.sub('00000' .. t[2], -6)
if redis.call('EXISTS', KEYS[3]) == 1 then -- a semaphore of the same name?
  local now = string.sub(tok, 1, -4)
  local gone = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now)
  for i = 1, #gone do redis.call('HDEL', KEYS[4], gone[i]) end
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
  if redis.call('ZCARD', KEYS[3]) > 0 then
    return {-1, redis.call('HGET', KEYS[4], '#limit') or '0'}
  end
  redis.call('DEL', KEYS[4])
end
local since = string.sub(tok, 1, -4)
redis.call('SET', KEYS[1], ARGV[1] .. tok .. ':' .. since .. ':' .. ARGV[3], 'PX', ARGV[2])
local last = tonumber(redis.call('SET', KEYS[2], tok, 'PX', ARGV[4], 'GET'))
if last and last >= tonumber(tok) then
  tok = string.format('%d', redis.call('INCRBY', KEYS[2], string.format('%d', last - tonumber(tok) + 1)))
  redis.call('SET', KEYS[1], ARGV[1] .. tok .. ':' .. since .. ':' .. ARGV[3], 'PX', ARGV[2])
end
return tok
