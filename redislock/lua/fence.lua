-- Records a token in a fence unless a higher one is recorded, and with a
-- data key also writes the data, in the same step (Fence.Apply).
-- KEYS: <prefix>fence/{<esc>} [, the data key, with the same hash tag].
-- ARGV: the token in decimal [, the data].
-- Reply: {1} accepted (and the data set) | {0, the recorded token} stale:
-- nothing recorded, nothing written.
--
-- Tokens travel and are stored as decimal strings without leading zeros and
-- are compared as such, length first and then byte by byte: Lua numbers are
-- doubles, exact only up to 2^53, and Lua's string '<' follows the server's
-- collation locale.
local tok, cur = ARGV[1], redis.call('GET', KEYS[1])
if cur then
  local below = #tok < #cur
  if #tok == #cur then
    for i = 1, #tok do
      local a, b = string.byte(tok, i), string.byte(cur, i)
      if a ~= b then below = a < b break end
    end
  end
  if below then return {0, cur} end
end
redis.call('SET', KEYS[1], tok)
if KEYS[2] then redis.call('SET', KEYS[2], ARGV[2]) end
return {1}
