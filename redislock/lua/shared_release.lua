-- Removes a reader of a name held shared (shared_acquire.lua), if it is
-- still there; the last reader hands the name to the first writer queued
-- behind the readers (as mutex_release.lua grants it), or, with none,
-- announces it on the name's channel if readers wait. Raises the
-- factory's seen mark if asked (see mutex_release.lua).
-- KEYS: lock, the factory's seen mark, token, queue, permits.
-- ARGV: the reader's id (without ':'), the releasing client's clock in
-- ms, heard (as mutex_release.lua), token retention ms, the number to
-- raise the mark to ('' for none) and for how many ms.
-- Reply: 1 released, 0 not ours.
local id = ARGV[1]
local channel = string.sub(KEYS[1], 1, -5) .. 'released'
if ARGV[5] ~= '' then
  local old = tonumber(redis.call('GET', KEYS[2]) or '0') or 0
  if old < tonumber(ARGV[5]) or redis.call('PTTL', KEYS[2]) < tonumber(ARGV[6]) then
    redis.call('SET', KEYS[2], string.format('%d', math.max(old, tonumber(ARGV[5]))), 'PX', ARGV[6])
  end
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

-- grant hands the free name to the first writer whose factory hears the
-- grant, with the 'r' flag if readers wait, or announces it to them.
local function grant(r)
  while true do
    local e = redis.call('LPOP', KEYS[4])
    if not e then break end
    local _, n, eid, ttl, cl = string.find(e, '^(%x+:)(%d+):(%d+):')
    if eid then
      local c = n + tonumber(cl)
      local tok = draw()
      if redis.call('PUBLISH', string.sub(e, n + 1, c), eid .. tok .. ':' .. ttl .. ':' .. KEYS[1]) > 0 or ARGV[3] ~= '1' then
        redis.call('SET', KEYS[1], eid .. tok .. ':' .. ARGV[2] .. ':' .. string.sub(e, c + 1) .. (r and '\nqr' or '\nq'), 'PX', ttl)
        return
      end
    end
  end
  if r then redis.call('PUBLISH', channel, 'r') end
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local s = redis.pcall('ZSCORE', KEYS[1], id)
if type(s) == 'table' then return 0 end -- a writer holds the name: this reader is long gone
local ok = 0
if s then
  if tonumber(s) > now then ok = 1 end
  redis.call('ZREM', KEYS[1], id)
  redis.call('HDEL', KEYS[5], id)
end
local nows = string.format('%d', now)
local gone = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', nows)
if #gone > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', nows)
  for i = 1, #gone do redis.call('HDEL', KEYS[5], gone[i]) end
end
if redis.call('EXISTS', KEYS[1]) == 1 then return ok end
local r = redis.call('HGET', KEYS[5], '#r')
redis.call('DEL', KEYS[5])
grant(r)
return ok
