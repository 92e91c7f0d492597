-- Takes a mutex, or puts a waiter in its queue.
-- KEYS: lock, token, the factory's seen mark, permits, and for a caller
-- that waits the queue.
-- ARGV: "<id>:", ttl ms, the caller's clock in ms (since when it holds,
-- for Inspect), meta JSON, token retention ms, the request's number (see
-- below), and for a caller that waits: 'w', or 'q' if it is in the queue
-- already as far as it knows; the waiting factory's channel ('' if the
-- caller does not join the queue yet).
-- Reply: the token (a string) | {0, ms: when to look again} |
-- {-1, the limit in force} | {-3, '0'} a newer request of the caller's
-- factory took the name since this one was sent: look again.
--
-- A held mutex's value is "<id>:<token>:<since ms>:<meta>", and, once
-- somebody waits, "\n" and flags: 'q' the queue may hold waiters (the
-- release hands the name to the first, mutex_release.lua), 'r' readers
-- wait for the name (its release announces it). The queue is a list of
-- its own, one entry per waiter in arrival order,
-- "<id>:<ttl ms>:<channel length>:<channel><meta>", kept for at least
-- a TTL of each waiter after its last look (see join). So the value stays
-- small whatever the number of waiters, and only waiters and hand-offs
-- touch the queue.
--
-- Free: a token is drawn, the lock set for one TTL, and the factory's
-- seen mark for the name raised to the request's number. Every request a
-- factory sends has a number larger than the ones before; the mark, kept
-- two TTLs, is the number of the last request of the factory that took
-- the name (or that it gave up on), and a request whose number is not
-- above it takes nothing. So a copy of a request that reaches the server
-- late (delayed past the client's timeout and cleaned up, or retried by
-- the client and released since) cannot take the name for an id nobody
-- holds, and no acquire writes a key of its own. A caller that does not
-- wait tries SET NX at once (the uncontended acquire is INCR, SET NX and
-- SET of the mark: a try that finds the name held uses up a token); a
-- waiter looks first (GET), as it mostly finds the name held.
--
-- Held: "ours" (the value starts with the id: a release granted the name
-- to this waiter, or the client retried this acquire) renews the lease,
-- raises the mark and returns the token. Otherwise a waiter joins the
-- queue (RPUSH, and the 'q' flag on the value), and the reply is the
-- lease left.
--
-- Held as a semaphore or shared: the lock is then the sorted set of its
-- permits or readers (sem_acquire.lua, shared_acquire.lua). Another limit
-- is a mismatch. Behind readers a waiter queues, which turns new readers
-- away (writer preference), and the last reader's release hands the name
-- to the first of the queue. A set whose members all expired is a free
-- name.
--
-- Tokens come from the counter: one above the last, or the server clock
-- in microseconds if the counter is missing, not a number, or below 10^15
-- (a clock before 2001: not one of ours), so that a lost counter never
-- restarts low; a counter of another type fails the script.
local id, ttl, waits, ch = ARGV[1], ARGV[2], ARGV[7], ARGV[8]

local function draw()
  local n = redis.pcall('INCR', KEYS[2])
  if type(n) == 'number' and n >= 1e15 then return string.format('%d', n) end
  if type(n) == 'table' and not string.find(n.err, 'not an integer', 1, true) then error(n) end
  local t = redis.call('TIME')
  local tok = t[1] .. string.sub('00000' .. t[2], -6)
  redis.call('SET', KEYS[2], tok, 'PX', ARGV[5])
  return tok
end

-- mark raises the factory's seen mark to this request's number, and
-- reports false if it was there already (a newer request took the name).
local function mark()
  local old = redis.call('SET', KEYS[3], ARGV[6], 'PX', 2 * ttl, 'GET')
  if old and (tonumber(old) or 0) >= tonumber(ARGV[6]) then
    redis.call('SET', KEYS[3], old, 'PX', 2 * ttl)
    return false
  end
  return true
end

-- took completes a take of the lock, just set for the id with tok.
local function took(tok)
  if not mark() then
    redis.call('DEL', KEYS[1])
    return {-3, '0'}
  end
  return tok
end

if not waits then
  local tok = draw()
  if redis.call('SET', KEYS[1], id .. tok .. ':' .. ARGV[3] .. ':' .. ARGV[4], 'NX', 'PX', ttl) then return took(tok) end
  waits, ch = '', ''
end

-- The name is held, or the caller waits.
local entry = id .. ttl .. ':' .. #ch .. ':' .. ch .. ARGV[4]

local function free()
  local tok = draw()
  redis.call('SET', KEYS[1], id .. tok .. ':' .. ARGV[3] .. ':' .. ARGV[4], 'PX', ttl)
  local r = took(tok)
  if ch ~= '' and r == tok then -- a waiter took a free name: the others still wait
    if waits == 'q' then redis.call('LREM', KEYS[5], 0, entry) end
    if redis.call('LLEN', KEYS[5]) > 0 then redis.call('APPEND', KEYS[1], '\nq') end
  end
  return r
end

-- join puts the waiter at the end of the queue, once, and keeps the
-- queue for at least a TTL of its: a waiter looks again within its TTL.
-- The queue's expiry is only ever raised (to two TTLs), so a waiter with
-- a short TTL does not cut the wait of one with a long TTL short.
local function join()
  if not (waits == 'q' and redis.call('LPOS', KEYS[5], entry)) then redis.call('RPUSH', KEYS[5], entry) end
  if redis.call('PTTL', KEYS[5]) < tonumber(ttl) then redis.call('PEXPIRE', KEYS[5], 2 * ttl) end
end

local v = redis.pcall('GET', KEYS[1])
if not v then return free() end
if type(v) == 'table' then -- a sorted set: permits or readers
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
  local left = last[2] and tonumber(last[2]) - now or 0
  if left <= 0 then
    redis.call('DEL', KEYS[1], KEYS[4])
    return free()
  end
  local limit = redis.call('HGET', KEYS[4], '#limit') or '0'
  if limit ~= '1' then return {-1, limit} end
  if ch == '' then return {0, left} end
  join()
  return {0, math.min(left, tonumber(ttl))}
end
if string.sub(v, 1, #id) == id then
  redis.call('PEXPIRE', KEYS[1], ttl)
  mark()
  return string.match(v, '^[^:]*:(%d+):')
end
if ch ~= '' then
  join()
  local nl = string.find(v, '\n', 1, true)
  if not (nl and string.find(v, 'q', nl + 1, true)) then redis.call('APPEND', KEYS[1], nl and 'q' or '\nq') end
end
return {0, redis.call('PTTL', KEYS[1])}
