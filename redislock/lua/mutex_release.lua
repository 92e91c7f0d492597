-- Gives a mutex up if it is still this holder's: to the first waiter in
-- its queue (see mutex_acquire.lua), or, with nobody queued, by deleting
-- it. Takes the id out of the queue if it is only waiting there (a waiter
-- that gave up). Writes the id's tombstone in any case. Also the cleanup
-- of a failed attempt and of a waiter that gave up. In shared mode it
-- removes a reader (see shared_acquire.lua) instead, and the last reader
-- hands the name to the first waiter queued behind the placeholder.
-- KEYS: lock, the id's tombstone, token, slots, permits, the
-- readers-waiting marker.
-- ARGV: "<id>:" (shared mode: the id without ':'), tombstone ms, heard
-- ('1': one server has every subscriber, so a PUBLISH that reaches
-- nobody means the waiter's factory is gone), the releasing client's
-- clock in ms, token retention ms, the name's channel, 's' for shared
-- mode.
-- Reply: 1 released, 0 not ours.
--
-- A grant sets the lock to the waiter's id, with its TTL and meta and
-- the next token (this holder's + 1, or the placeholder's), and publishes
-- "<id>:<token>:<ttl>:<lock key>" on the waiter's factory channel: one
-- call wakes one waiter of one process. The token counter is written only
-- when the name is freed: a grant's token is above the counter and
-- every token before it, and a name freed by expiry instead is taken next
-- with the server clock, which by then has passed every token of the chain
-- (each grant took more than a microsecond, and the lease a TTL). A
-- name freed while readers wait for it (the marker is set) is announced on
-- its channel.
redis.call('SET', KEYS[2], '1', 'PX', ARGV[2])
local v = redis.call('GET', KEYS[1])
local id = ARGV[1]

-- entry parses the queue entry at i (its '\n'): id, ttl, channel, meta
-- and where the next entry starts.
local function entry(i)
  local _, e, eid, ttl, n = string.find(v, '^\n(%x+):(%d+):(%d+):', i)
  if not e then return nil end
  local c = e + tonumber(n)
  local j = string.find(v, '\n', c + 1, true) or #v + 1
  return eid, ttl, string.sub(v, e + 1, c), string.sub(v, c + 1, j - 1), j
end

-- grant gives the name, held with token tok, to the first waiter whose
-- factory hears the grant, or frees it.
local function grant(tok)
  local i = tok and string.find(v, '\n', 1, true)
  while i do
    local eid, ttl, ch, meta, j = entry(i)
    if not eid then break end
    local next = string.format('%d', tok + 1)
    if redis.call('PUBLISH', ch, eid .. ':' .. next .. ':' .. ttl .. ':' .. KEYS[1]) > 0 or ARGV[3] ~= '1' then
      redis.call('SET', KEYS[1], eid .. ':' .. next .. ':' .. ARGV[4] .. ':' .. meta .. string.sub(v, j), 'PX', ttl)
      return
    end
    if j > #v then break end
    i = j
  end
  redis.call('DEL', KEYS[1])
  if tok then redis.call('SET', KEYS[3], string.format('%d', tok), 'PX', ARGV[5]) end
  if redis.call('DEL', KEYS[6]) == 1 then redis.call('PUBLISH', ARGV[6], 'r') end
end

if ARGV[7] == 's' then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local nows = string.format('%d', now)
  local s = redis.call('ZSCORE', KEYS[4], id)
  local ok = 0
  if s then
    if tonumber(s) > now then ok = 1 end
    redis.call('ZREM', KEYS[4], id)
    redis.call('HDEL', KEYS[5], id)
  end
  local gone = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', nows)
  if #gone > 0 then
    redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', nows)
    for i = 1, #gone do redis.call('HDEL', KEYS[5], gone[i]) end
  end
  if redis.call('ZCARD', KEYS[4]) > 0 then return ok end
  redis.call('DEL', KEYS[5])
  if v and string.sub(v, 1, 7) == 'shared:' then
    local _, _, tok = string.find(v, '^shared:(%d+):')
    grant(tonumber(tok))
  end
  return ok
end

if not v then return 0 end
if string.sub(v, 1, #id) ~= id then
  local i = string.find(v, '\n' .. id, 1, true)
  if i then
    local eid, _, _, _, j = entry(i)
    if eid then
      v = string.sub(v, 1, i - 1) .. string.sub(v, j)
      if string.sub(v, 1, 7) == 'shared:' and not string.find(v, '\n', 1, true) then
        grant(nil) -- the last writer waiting for the readers gave up
      else
        redis.call('SET', KEYS[1], v, 'KEEPTTL')
      end
    end
  end
  return 0
end
local _, _, tok = string.find(v, '^[^:]*:(%d+):')
grant(tonumber(tok))
return 1
