-- Frees a name whoever holds it (an operator's Break): deletes the mutex,
-- or every live permit of the semaphore, keeps the token counter, raises
-- the fence record of the key equal to the name to one above the highest
-- token it freed, and wakes waiters as a release does.
-- KEYS: lock, slots, permits, <prefix>fence/{<esc>}.
-- ARGV: channel.
-- Reply: {} nothing held | the freed holders' tokens ('0' if unreadable).
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

local toks = {}
local v = redis.call('GET', KEYS[1])
if v then
  local _, _, tok = string.find(v, '^[^:]*:(%d+):')
  toks[1] = tok or '0'
  redis.call('DEL', KEYS[1])
else
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local ps = redis.call('ZRANGEBYSCORE', KEYS[2], '(' .. string.format('%d', now), '+inf')
  if #ps == 0 then return {} end
  for i = 1, #ps do
    local _, _, tok = string.find(redis.call('HGET', KEYS[3], ps[i]) or '', '^(%d+):')
    toks[i] = tok or '0'
  end
  redis.call('DEL', KEYS[2], KEYS[3])
end
local top = '0'
for i = 1, #toks do
  if below(top, toks[i]) then top = toks[i] end
end
local floor = succ(top)
local cur = redis.call('GET', KEYS[4])
if not cur or below(cur, floor) then redis.call('SET', KEYS[4], floor) end
redis.call('PUBLISH', ARGV[1], 'r')
return toks
