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
-- Held shared (live readers in slots, '#limit' '1', see
-- shared_acquire.lua): a waiter that joins sets the lock to the
-- placeholder "shared:<token>:<since>:" with itself queued after it, for
-- two of its TTLs (every queued look renews that), which turns new
-- readers away (writer preference); the last reader's release hands the
-- name to the first waiter, with the placeholder's token + 1 (drawn from
-- the counter when it was set, so above every reader's). A placeholder
-- whose readers are all gone (killed: nobody released) is taken by the
-- look that finds it, as a free name, keeping the rest of the queue.
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

-- readers drops the expired readers (or permits) and returns the ms until
-- the last live one ends, 0 if none is left.
local function readers()
  local t = redis.call('TIME')
  local now = string.format('%d', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
  local gone = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now)
  for i = 1, #gone do redis.call('HDEL', KEYS[4], gone[i]) end
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
  local last = redis.call('ZRANGE', KEYS[3], -1, -1, 'WITHSCORES')
  if #last == 0 then
    redis.call('DEL', KEYS[4])
    return 0
  end
  return tonumber(last[2]) - tonumber(now) + 1
end

-- draw returns the next token from the counter, never below the clock.
local function draw()
  local t = redis.call('TIME')
  local tok = t[1] .. string.sub('00000' .. t[2], -6)
  local last = tonumber(redis.call('SET', KEYS[2], tok, 'PX', ARGV[4], 'GET'))
  if last and last >= tonumber(tok) then
    tok = string.format('%d', redis.call('INCRBY', KEYS[2], string.format('%d', last - tonumber(tok) + 1)))
  end
  return tok
end

local id = ARGV[1]
local line = '\n' .. id .. ARGV[2] .. ':' .. #ARGV[5] .. ':' .. ARGV[5] .. ARGV[3]
local v = redis.call('GET', KEYS[1])
if v then
  if string.sub(v, 1, #id) == id then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    local _, _, held = string.find(v, '^[^:]*:([^:]*):')
    return held
  end
  if string.sub(v, 1, 7) == 'shared:' then
    local left = readers()
    if left == 0 then -- the readers are gone without releasing: take it
      local _, _, ptok = string.find(v, '^shared:(%d+):')
      local tok = string.format('%d', tonumber(ptok) + 1)
      local q = string.sub(v, (string.find(v, '\n', 1, true) or #v + 1))
      local i = string.find(q, '\n' .. id, 1, true)
      if i then
        local j = string.find(q, '\n', i + 1, true) or #q + 1
        q = string.sub(q, 1, i - 1) .. string.sub(q, j)
      end
      local t = redis.call('TIME')
      local since = t[1] .. string.sub('00' .. math.floor(tonumber(t[2]) / 1000), -3)
      redis.call('SET', KEYS[1], id .. tok .. ':' .. since .. ':' .. ARGV[3] .. q, 'PX', ARGV[2])
      return tok
    end
    if ARGV[5] == '' then return {0, left} end
    if not string.find(v, '\n' .. id, 1, true) then redis.call('APPEND', KEYS[1], line) end
    if redis.call('PTTL', KEYS[1]) < 2 * tonumber(ARGV[2]) then redis.call('PEXPIRE', KEYS[1], 2 * tonumber(ARGV[2])) end
    return {0, math.min(left, tonumber(ARGV[2]))}
  end
  if ARGV[5] == '' or string.find(v, '\n' .. id, 1, true) then
    return {0, redis.call('PTTL', KEYS[1])}
  end
  redis.call('APPEND', KEYS[1], line)
  return {0, ARGV[2]}
end
if redis.call('EXISTS', KEYS[5]) == 1 then return {-2, '0'} end
local t = redis.call('TIME')
local tok = t[1] .. string.sub('00000' .. t[2], -6)
if redis.call('EXISTS', KEYS[3]) == 1 then -- a semaphore, or readers, of the same name?
  local left = readers()
  if left > 0 then
    local limit = redis.call('HGET', KEYS[4], '#limit') or '0'
    if limit ~= '1' then return {-1, limit} end
    if ARGV[5] == '' then return {0, left} end
    local since = string.sub(tok, 1, -4)
    redis.call('SET', KEYS[1], 'shared:' .. draw() .. ':' .. since .. ':' .. line, 'PX', 2 * tonumber(ARGV[2]))
    return {0, math.min(left, tonumber(ARGV[2]))}
  end
end
local since = string.sub(tok, 1, -4)
redis.call('SET', KEYS[1], ARGV[1] .. tok .. ':' .. since .. ':' .. ARGV[3], 'PX', ARGV[2])
local last = tonumber(redis.call('SET', KEYS[2], tok, 'PX', ARGV[4], 'GET'))
if last and last >= tonumber(tok) then
  tok = string.format('%d', redis.call('INCRBY', KEYS[2], string.format('%d', last - tonumber(tok) + 1)))
  redis.call('SET', KEYS[1], ARGV[1] .. tok .. ':' .. since .. ':' .. ARGV[3], 'PX', ARGV[2])
end
return tok
