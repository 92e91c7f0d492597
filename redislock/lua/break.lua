-- Frees a name whoever holds it (an operator's Break), keeping the token
-- counter, and raises the fence record of the key equal to the name to one
-- above the highest token it frees.
-- KEYS: lock, permits, <prefix>fence/{<esc>}, queue.
-- ARGV: channel, ms to keep a mark that readers wait (see below).
-- Reply: {} nothing held | {'m', "<id>:"} a mutex: the fence is raised and
-- the caller releases it by the holder's id (mutex_release.lua, which
-- hands it to the first waiter of its queue) | {'s'} every live permit of
-- the semaphore deleted and its waiters woken, as sem_release.lua does |
-- {'d'} a mutex value not in redislock's form (an operator's SET) deleted.
-- A shared name's readers are freed as a semaphore's permits are; if
-- writers queue behind them, the reply is {'w'} and the caller then hands
-- the name to the first by a shared-mode release of nobody
-- (shared_release.lua), which finds no reader left; the mark that readers
-- wait behind the writers ('#r' in the permits) is kept for it.
--
-- Tokens are decimal strings, compared and incremented as such (see
-- fence.lua: Lua numbers are exact only up to 2^53).
local function below(a, b)
  if #a ~= #b then return #a < #b end
  for i = 1, #a do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x < y end
  end
  return false
end

local function succ(s)
  local i = #s
  while i > 0 and string.byte(s, i) == 57 do i = i - 1 end -- '9'
  if i == 0 then return '1' .. string.rep('0', #s) end
  return string.sub(s, 1, i - 1) .. string.char(string.byte(s, i) + 1) .. string.rep('0', #s - i)
end

-- raise sets the fence record to one above the highest of toks, unless it
-- is higher already.
local function raise(toks)
  local top = '0'
  for i = 1, #toks do
    if below(top, toks[i]) then top = toks[i] end
  end
  local floor = succ(top)
  local cur = redis.call('GET', KEYS[3])
  if not cur or below(cur, floor) then redis.call('SET', KEYS[3], floor) end
end

local v = redis.pcall('GET', KEYS[1])
if not v then return {} end
if type(v) == 'string' then
  local _, _, id, tok = string.find(v, '^(%x+:)(%d+):')
  if id then
    raise({tok})
    return {'m', id}
  end
  raise({})
  redis.call('DEL', KEYS[1])
  return {'d'}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ps = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. string.format('%d', now), '+inf')
if #ps == 0 then return {} end
local toks = {}
for i = 1, #ps do
  local _, _, tok = string.find(redis.call('HGET', KEYS[2], ps[i]) or '', '^(%d+):')
  toks[i] = tok or '0'
end
raise(toks)
local writer = redis.call('HGET', KEYS[2], '#limit') == '1' and redis.call('EXISTS', KEYS[4]) == 1
local r = redis.call('HGET', KEYS[2], '#r')
redis.call('DEL', KEYS[1], KEYS[2])
redis.call('PUBLISH', ARGV[1], 'r')
if not writer then return {'s'} end
if r then redis.call('HSET', KEYS[2], '#r', '1') redis.call('PEXPIRE', KEYS[2], ARGV[2]) end
return {'w'}
