package redislock

import "github.com/redis/go-redis/v9"

// The Lua scripts. Every operation is one script so that it is one round
// trip and atomic on the server. All keys of one name share the hash tag
// {<escaped name>}, so the scripts also run on Redis Cluster.
//
// KEYS, in every script: [1] lock (string, a mutex holder), [2] token
// (counter), [3] slots (zset of semaphore permit ids scored by expiry in
// server milliseconds), [4] permits (hash: permit id -> "token:since:meta",
// and "#limit" -> the semaphore's limit); for acquire and release [5] the
// id's tombstone (see keys.tombOf).
//
// A holder is identified by a random id that is unique per acquisition. A
// mutex holder's value is "id:token:since:meta"; only the id is compared, so
// a holder whose acquire reply was lost can still be cleaned up by its id.
//
// Release (also the cleanup of a failed attempt) writes the id's tombstone,
// which lives for one TTL, and acquire refuses an id that has one: an
// acquire request that reaches the server only after its attempt was given
// up (delayed past the client's timeout, then cleaned up; or retried by the
// client on another connection, held, and released) would otherwise take
// the name for an id nobody holds, for a whole TTL.
//
// Numbers: Lua numbers are doubles and redis.call turns them into strings
// with 14 significant digits, so every number written to Redis is formatted
// with %d first.

// prelude reads the server clock and defines the helpers the semaphore
// scripts share.
const prelude = `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local nows = string.format('%d', now)

-- sweep drops expired permits and returns how many are left.
local function sweep()
  local gone = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', nows)
  if #gone > 0 then
    redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', nows)
    for i = 1, #gone do redis.call('HDEL', KEYS[4], gone[i]) end
  end
  local n = redis.call('ZCARD', KEYS[3])
  if n == 0 then redis.call('DEL', KEYS[4]) end
  return n, #gone
end

-- keep makes the semaphore's keys live exactly as long as its last permit.
local function keep()
  local last = redis.call('ZRANGE', KEYS[3], -1, -1, 'WITHSCORES')
  if #last == 0 then return end
  local ms = string.format('%d', tonumber(last[2]) - now + 1)
  redis.call('PEXPIRE', KEYS[3], ms)
  redis.call('PEXPIRE', KEYS[4], ms)
end
`

// The mutex scripts come first and are kept lean: an uncontended acquire
// and release should cost little more than SET NX PX and a compare-and-
// delete. The holder's id is passed with its ':' ("id:"), the prefix of its
// value.

// mutexAcquireSrc takes a mutex.
// KEYS: lock, token, slots, permits, tombstone. ARGV: "id:", ttl ms, meta,
// token retention ms.
// Reply: the token (a string) | {0, ms until the holder's lease ends} |
// {-1, the semaphore limit in force} | {-2, '0'} the id was given up.
//
// Tokens: one more than the last, but never below the server clock in
// microseconds, so a token counter that was lost (a restart without
// persistence, eviction, expiry) never restarts low.
//
// It is the hot path, so it makes as few calls as it can: EXISTS (the
// tombstone), TIME, EXISTS, SET NX and the counter's SET GET when the name
// is free. The lock is set
// with the clock token before the counter is read; in the rare case that
// the counter is ahead of the clock (two acquires in one microsecond, or
// the server clock stepped back) the token is raised and the value set
// again, within the same atomic script. If the counter write fails (a
// key of the wrong type) the script stops with the lock set: the client
// then removes it by its id, as after any failed acquire.
const mutexAcquireSrc = `
if redis.call('EXISTS', KEYS[5]) == 1 then return {-2, '0'} end
local t = redis.call('TIME')
local tok = t[1] .. string.sub('00000' .. t[2], -6)
if redis.call('EXISTS', KEYS[3]) == 1 then -- a semaphore of the same name?
  local now = string.sub(tok, 1, -4)
  local gone = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now)
  for i = 1, #gone do redis.call('HDEL', KEYS[4], gone[i]) end
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
  if redis.call('ZCARD', KEYS[3]) > 0 then
    return {-1, redis.call('HGET', KEYS[4], '#limit') or '0'}
  end
  redis.call('DEL', KEYS[4])
end
local since = string.sub(tok, 1, -4)
if not redis.call('SET', KEYS[1], ARGV[1] .. tok .. ':' .. since .. ':' .. ARGV[3], 'NX', 'PX', ARGV[2]) then
  local v = redis.call('GET', KEYS[1])
  if v and string.sub(v, 1, #ARGV[1]) == ARGV[1] then -- our own acquire, retried by the client
    local _, _, held = string.find(v, '^[^:]*:([^:]*):')
    return held
  end
  return {0, redis.call('PTTL', KEYS[1])}
end
local last = tonumber(redis.call('SET', KEYS[2], tok, 'PX', ARGV[4], 'GET'))
if last and last >= tonumber(tok) then
  tok = string.format('%d', redis.call('INCRBY', KEYS[2], string.format('%d', last - tonumber(tok) + 1)))
  redis.call('SET', KEYS[1], ARGV[1] .. tok .. ':' .. since .. ':' .. ARGV[3], 'PX', ARGV[2])
end
return tok
`

// mutexReleaseSrc deletes a mutex if it is still this holder's, and wakes
// waiters; it writes the id's tombstone in any case. KEYS: lock,
// tombstone. ARGV: "id:", channel, tombstone ms. Reply: 1 released, 0 not
// ours.
const mutexReleaseSrc = `
redis.call('SET', KEYS[2], '1', 'PX', ARGV[3])
local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, #ARGV[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], 'r')
  return 1
end
return 0
`

// mutexExtendSrc pushes a mutex's expiry one TTL into the future if it is
// still this holder's. KEYS: lock. ARGV: "id:", ttl ms. Reply: 1 or 0.
const mutexExtendSrc = `
local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, #ARGV[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
`

// mutexExtendManySrc is mutexExtendSrc for many mutexes in one call, for
// the renewal loop on a server where all keys live together (not a
// cluster, not a ring). KEYS: lock keys. ARGV: "id:" and ttl ms for each
// key in turn. Reply: 1 or 0 for each key.
const mutexExtendManySrc = `
local out = {}
for i = 1, #KEYS do
  local v = redis.call('GET', KEYS[i])
  local id = ARGV[2 * i - 1]
  if v and string.sub(v, 1, #id) == id then
    redis.call('PEXPIRE', KEYS[i], ARGV[2 * i])
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
`

// semAcquireSrc takes a semaphore permit.
// KEYS: lock, token, slots, permits, tombstone. ARGV: id, ttl ms, limit,
// meta, token retention ms. Reply as mutexAcquireSrc.
const semAcquireSrc = prelude + `
if redis.call('EXISTS', KEYS[5]) == 1 then return {-2, '0'} end
local id, ttl, limit = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
if redis.call('EXISTS', KEYS[1]) == 1 then return {-1, '1'} end
local n = sweep()
if redis.call('ZSCORE', KEYS[3], id) then -- our own acquire, retried
  local _, _, tok = string.find(redis.call('HGET', KEYS[4], id) or '0:0:', '^([^:]*):')
  return tok
end
if n > 0 then
  local have = tonumber(redis.call('HGET', KEYS[4], '#limit'))
  if have and have ~= limit then return {-1, string.format('%d', have)} end
  if n >= limit then
    local first = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')
    return {0, tonumber(first[2]) - now}
  end
end
local tok = t[1] .. string.format('%06d', t[2])
local last = tonumber(redis.call('SET', KEYS[2], tok, 'PX', ARGV[5], 'GET'))
if last and last >= tonumber(tok) then
  tok = string.format('%d', redis.call('INCRBY', KEYS[2], string.format('%d', last - tonumber(tok) + 1)))
end
redis.call('ZADD', KEYS[3], string.format('%d', now + ttl), id)
redis.call('HSET', KEYS[4], id, tok .. ':' .. nows .. ':' .. ARGV[4], '#limit', ARGV[3])
keep()
return tok
`

// semReleaseSrc removes this holder's permit, if it is still there, and
// wakes waiters; it writes the id's tombstone in any case. KEYS: lock,
// token, slots, permits, tombstone. ARGV: id, channel, tombstone ms.
// Reply: 1 released, 0 not ours (lost).
const semReleaseSrc = prelude + `
redis.call('SET', KEYS[5], '1', 'PX', ARGV[3])
local s = redis.call('ZSCORE', KEYS[3], ARGV[1])
local ok = 0
if s then
  if tonumber(s) > now then ok = 1 end
  redis.call('ZREM', KEYS[3], ARGV[1])
  redis.call('HDEL', KEYS[4], ARGV[1])
end
local _, swept = sweep()
if s or swept > 0 then redis.call('PUBLISH', ARGV[2], 'r') end
return ok
`

// semExtendSrc pushes this holder's permit one TTL into the future, if it
// is still there. KEYS: lock, token, slots, permits. ARGV: id, ttl ms.
// Reply: 1 extended, 0 not ours (lost).
const semExtendSrc = prelude + `
local s = redis.call('ZSCORE', KEYS[3], ARGV[1])
if not s or tonumber(s) <= now then return 0 end
redis.call('ZADD', KEYS[3], 'XX', string.format('%d', now + tonumber(ARGV[2])), ARGV[1])
keep()
return 1
`

// inspectSrc reads who holds a name. It writes nothing.
// Reply: {} | {'1', value, pttl} | {limit, id, "token:since:meta", ms left, ...}.
const inspectSrc = `
local v = redis.call('GET', KEYS[1])
if v then return {'1', v, redis.call('PTTL', KEYS[1])} end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ps = redis.call('ZRANGEBYSCORE', KEYS[3], '(' .. string.format('%d', now), '+inf', 'WITHSCORES')
if #ps == 0 then return {} end
local out = {redis.call('HGET', KEYS[4], '#limit') or '0'}
for i = 1, #ps, 2 do
  out[#out + 1] = ps[i]
  out[#out + 1] = redis.call('HGET', KEYS[4], ps[i]) or '0:0:'
  out[#out + 1] = tonumber(ps[i + 1]) - now
end
return out
`

var (
	mutexAcquire  = redis.NewScript(mutexAcquireSrc)
	mutexRelease  = redis.NewScript(mutexReleaseSrc)
	mutexExtend   = redis.NewScript(mutexExtendSrc)
	mutexExtendN  = redis.NewScript(mutexExtendManySrc)
	semAcquire    = redis.NewScript(semAcquireSrc)
	semRelease    = redis.NewScript(semReleaseSrc)
	semExtend     = redis.NewScript(semExtendSrc)
	inspectScript = redis.NewScript(inspectSrc)
)
