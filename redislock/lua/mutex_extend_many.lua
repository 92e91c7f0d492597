-- mutex_extend.lua for many mutexes in one call, for the renewal loop on a
-- server where all keys live together (not a cluster, not a ring).
-- KEYS: lock keys.
-- ARGV: "<id>:" and ttl ms for each key in turn.
-- Reply: 1 or 0 for each key.
local out = {}
for i = 1, #KEYS do
  local v = redis.pcall('GET', KEYS[i])
  local id = ARGV[2 * i - 1]
  if type(v) == 'string' and string.sub(v, 1, #id) == id then
    redis.call('PEXPIRE', KEYS[i], ARGV[2 * i])
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
