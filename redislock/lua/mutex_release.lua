-- Gives a mutex up if it is still this holder's: to the first waiter in
-- its queue (see mutex_acquire.lua), or, with nobody queued, by deleting
-- it. Takes the id out of the queue if it is only waiting there (a waiter
-- that gave up). Writes the id's tombstone in any case. Also the cleanup
-- of a failed attempt and of a waiter that gave up.
-- KEYS: lock, the id's tombstone, token.
-- ARGV: "<id>:", tombstone ms, heard ('1': one server has every
-- subscriber, so a PUBLISH that reaches nobody means the waiter's factory
-- is gone), the releasing client's clock in ms, token retention ms.
-- Reply: 1 released, 0 not ours.
--
-- A hand-off sets the lock to the waiter's id, with its TTL and meta and
-- the next token (this holder's + 1), and publishes
-- "<id>:<token>:<ttl>:<lock key>" on the waiter's factory channel: one
-- call wakes one waiter of one process. The token counter is written only
-- when the name is freed: a hand-off's token is above the counter and
-- every token before it, and a name freed by expiry instead is taken next
-- with the server clock, which by then has passed every token of the chain
-- (each hand-off took more than a microsecond, and the lease a TTL).
redis.call('SET', KEYS[2], '1', 'PX', ARGV[2])
local v = redis.call('GET', KEYS[1])
if not v then return 0 end
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

if string.sub(v, 1, #id) ~= id then
  local i = string.find(v, '\n' .. id, 1, true)
  if i then
    local eid, _, _, _, j = entry(i)
    if eid then
      redis.call('SET', KEYS[1], string.sub(v, 1, i - 1) .. string.sub(v, j), 'KEEPTTL')
    end
  end
  return 0
end
local _, _, tok = string.find(v, '^[^:]*:(%d+):')
tok = tonumber(tok)
local i = tok and string.find(v, '\n', 1, true)
while i do
  local eid, ttl, ch, meta, j = entry(i)
  if not eid then break end
  local next = string.format('%d', tok + 1)
  if redis.call('PUBLISH', ch, eid .. ':' .. next .. ':' .. ttl .. ':' .. KEYS[1]) > 0 or ARGV[3] ~= '1' then
    redis.call('SET', KEYS[1], eid .. ':' .. next .. ':' .. ARGV[4] .. ':' .. meta .. string.sub(v, j), 'PX', ttl)
    return 1
  end
  if j > #v then break end
  i = j
end
redis.call('DEL', KEYS[1])
if tok then redis.call('SET', KEYS[3], string.format('%d', tok), 'PX', ARGV[5]) end
return 1
