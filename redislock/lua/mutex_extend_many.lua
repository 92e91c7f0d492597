-- mutex_extend.lua for many mutexes of one TTL in one call, for the
-- renewal loop on a server where all keys live together (not a cluster,
-- not a ring): one MGET reads them all.
-- KEYS: lock keys.
-- ARGV: ttl ms, then "<id>:" for each key in turn.
-- Reply: 1 or 0 for each key.
local vs = redis.call('MGET', unpack(KEYS))
local out = {}
for i = 1, #KEYS do
  local v, id = vs[i], ARGV[i + 1]
  if v and string.sub(v, 1, #id) == id then
    redis.call('PEXPIRE', KEYS[i], ARGV[1])
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
