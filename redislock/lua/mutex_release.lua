-- Gives a mutex up if it is still this holder's: to the first waiter of
-- its queue if the value is flagged 'q' (see mutex_acquire.lua), else by
-- deleting it. Takes a waiter that gives up out of the queue. Also the
-- cleanup of a failed attempt and of a waiter that gave up: those, and a
-- holder that held for more than half its TTL, raise the factory's seen
-- mark (see mutex_acquire.lua) to the number of their last request and
-- keep it for a TTL, so that a late copy of one takes nothing (the
-- acquire kept it for two TTLs).
-- KEYS: lock, the factory's seen mark, token, queue, and with a queue
-- entry the permits.
-- ARGV: "<id>:", the releasing client's clock in ms, heard ('1': one
-- server has every subscriber, so a PUBLISH that reaches nobody means the
-- waiter's factory is gone), token retention ms, and optionally the
-- number to raise the mark to ('' for none) and for how many ms, and the
-- caller's queue entry (if it may have queued: a writer that leaves the
-- queue behind readers, the last one, wakes the readers that wait behind
-- it).
-- Reply: 1 released, 0 not ours.
--
-- A grant takes the first entry of the queue, sets the lock to the
-- waiter's id with the next token (drawn as mutex_acquire.lua draws it),
-- its TTL and meta and the 'q' flag (more may wait; the release that
-- finds the queue empty frees the name), and publishes
-- "<id>:<token>:<ttl>:<lock key>" on the waiter's factory channel: one
-- call wakes one waiter of one process. A name freed while readers wait
-- for it (the 'r' flag) is announced on the name's channel,
-- "<prefix>{<esc>}:released".
local id = ARGV[1]
if ARGV[5] and ARGV[5] ~= '' then
  local old = tonumber(redis.call('GET', KEYS[2]) or '0') or 0
  if old < tonumber(ARGV[5]) or redis.call('PTTL', KEYS[2]) < tonumber(ARGV[6]) then
    redis.call('SET', KEYS[2], string.format('%d', math.max(old, tonumber(ARGV[5]))), 'PX', ARGV[6])
  end
end
local v = redis.pcall('GET', KEYS[1])
if type(v) ~= 'string' or string.sub(v, 1, #id) ~= id then
  if ARGV[7] and redis.call('LREM', KEYS[4], 0, ARGV[7]) > 0 and type(v) == 'table'
      and redis.call('EXISTS', KEYS[4]) == 0 and redis.call('HDEL', KEYS[5], '#r') == 1 then
    redis.call('PUBLISH', string.sub(KEYS[1], 1, -5) .. 'released', 'r')
  end
  return 0
end
local nl = string.find(v, '\n', 1, true)
if not nl then
  redis.call('DEL', KEYS[1])
  return 1
end

local function draw()
  local n = redis.pcall('INCR', KEYS[3])
  if type(n) == 'number' and n >= 1e15 then return string.format('%d', n) end
  if type(n) == 'table' and not string.find(n.err, 'not an integer', 1, true) then error(n) end
  local t = redis.call('TIME')
  local tok = t[1] .. string.sub('00000' .. t[2], -6)
  redis.call('SET', KEYS[3], tok, 'PX', ARGV[4])
  return tok
end

local r = string.find(v, 'r', nl + 1, true)
if string.find(v, 'q', nl + 1, true) then
  while true do
    local e = redis.call('LPOP', KEYS[4])
    if not e then break end
    local _, n, eid, ttl, cl = string.find(e, '^(%x+:)(%d+):(%d+):')
    if eid then
      local c = n + tonumber(cl)
      local tok = draw()
      if redis.call('PUBLISH', string.sub(e, n + 1, c), eid .. tok .. ':' .. ttl .. ':' .. KEYS[1]) > 0 or ARGV[3] ~= '1' then
        redis.call('SET', KEYS[1], eid .. tok .. ':' .. ARGV[2] .. ':' .. string.sub(e, c + 1) .. (r and '\nqr' or '\nq'), 'PX', ttl)
        return 1
      end
    end
  end
end
redis.call('DEL', KEYS[1])
if r then redis.call('PUBLISH', string.sub(KEYS[1], 1, -5) .. 'released', 'r') end
return 1
