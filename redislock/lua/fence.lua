-- Records a token in a fence unless a higher one is recorded.
-- KEYS: <prefix>fence/{<esc>}.
-- ARGV: the token in decimal.
-- Reply: {1} accepted | {0, the recorded token} stale: nothing recorded.
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
return {1}
