-- Gives a mutex up if it is still this holder's: to the first waiter of
-- its queue if the value is flagged 'q' (see mutex_acquire.lua), else by
-- deleting it. Takes a waiter that gives up out of the queue. In shared
-- mode it removes a reader (see shared_acquire.lua) instead, and the last
-- reader hands the name to the first writer queued behind the readers.
-- Also the cleanup of a failed attempt and of a waiter that gave up:
-- those, and a holder that held for more than half its TTL, write the
-- id's took marker, so that a late copy of the id's acquire takes
-- nothing for at least a TTL after this (the acquire wrote it for two).
-- KEYS: lock, the id's took marker, token, permits, queue.
-- ARGV: "<id>:" (shared mode: the id without ':'), the took marker's ms
-- ('' to leave it), heard ('1': one server has every subscriber, so a
-- PUBLISH that reaches nobody means the waiter's factory is gone), the
-- releasing client's clock in ms, token retention ms, the name's channel,
-- 's' for shared mode, the caller's queue entry ('' if it never queued).
-- Reply: 1 released, 0 not ours.
--
-- A grant takes the first entry of the queue, sets the lock to the
-- waiter's id with the next token (drawn as mutex_acquire.lua draws it),
-- its TTL and meta and the 'q' flag (more may wait; the release that
-- finds the queue empty frees the name), and publishes
-- "<id>:<token>:<ttl>:<lock key>" on the waiter's factory channel: one
-- call wakes one waiter of one process. A name freed while readers wait
-- for it (the 'r' flag, or '#r' in the permits of readers a writer
-- waited behind) is announced on its channel.
local id = ARGV[1]
if ARGV[2] ~= '' then redis.call('SET', KEYS[2], '1', 'PX', ARGV[2]) end

local function draw()
  local n = redis.pcall('INCR', KEYS[3])
  if type(n) == 'table' then
    if not string.find(n.err, 'not an integer', 1, true) then error(n) end
    n = 0
  end
  if n >= 1e15 then return string.format('%d', n) end
  local t = redis.call('TIME')
  local tok = t[1] .. string.sub('00000' .. t[2], -6)
  redis.call('SET', KEYS[3], tok, 'PX', ARGV[5])
  return tok
end

-- grant hands the name to the first waiter whose factory hears the grant,
-- or frees it; flags are those of the value given up.
local function grant(flags)
  local r = string.find(flags, 'r', 1, true)
  if string.find(flags, 'q', 1, true) then
    while true do
      local e = redis.call('LPOP', KEYS[5])
      if not e then break end
      local _, n, eid, ttl, cl = string.find(e, '^(%x+:)(%d+):(%d+):')
      if eid then
        local c = n + tonumber(cl)
        local tok = draw()
        if redis.call('PUBLISH', string.sub(e, n + 1, c), eid .. tok .. ':' .. ttl .. ':' .. KEYS[1]) > 0 or ARGV[3] ~= '1' then
          local flags = r and '\nqr' or '\nq'
          redis.call('SET', KEYS[1], eid .. tok .. ':' .. ARGV[4] .. ':' .. string.sub(e, c + 1) .. flags, 'PX', ttl)
          return
        end
      end
    end
  end
  redis.call('DEL', KEYS[1])
  if r then redis.call('PUBLISH', ARGV[6], 'r') end
end

if ARGV[7] == 's' then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local s = redis.pcall('ZSCORE', KEYS[1], id)
  if type(s) == 'table' then return 0 end -- a writer holds the name: this reader is long gone
  local ok = 0
  if s then
    if tonumber(s) > now then ok = 1 end
    redis.call('ZREM', KEYS[1], id)
    redis.call('HDEL', KEYS[4], id)
  end
  local nows = string.format('%d', now)
  local gone = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', nows)
  if #gone > 0 then
    redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', nows)
    for i = 1, #gone do redis.call('HDEL', KEYS[4], gone[i]) end
  end
  if redis.call('EXISTS', KEYS[1]) == 1 then return ok end
  local r = redis.call('HGET', KEYS[4], '#r')
  redis.call('DEL', KEYS[4])
  grant(r and 'qr' or 'q')
  return ok
end

local v = redis.pcall('GET', KEYS[1])
if type(v) == 'string' and string.sub(v, 1, #id) == id then
  local nl = string.find(v, '\n', 1, true)
  if nl then
    grant(string.sub(v, nl + 1))
  else
    redis.call('DEL', KEYS[1])
  end
  return 1
end
if ARGV[8] ~= '' and redis.call('LREM', KEYS[5], 0, ARGV[8]) > 0 and type(v) == 'table'
    and redis.call('EXISTS', KEYS[5]) == 0 and redis.call('HDEL', KEYS[4], '#r') == 1 then
  -- The last writer waiting behind the readers gave up: the readers
  -- that wait behind it may join.
  redis.call('PUBLISH', ARGV[6], 'r')
end
return 0
