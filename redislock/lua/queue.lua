-- The queue of a name's waiters, put in front of the scripts that take,
-- give up or leave a name (not a script of its own). Each such script sets
-- Q and W to its queue and waiters keys first.
-- Q (zset): the ids of the waiting acquisitions, scored by when each first
-- queued (server microseconds): FIFO across factories.
-- W (hash): id -> "<deadline ms>:<factory channel>". A waiter pushes its
-- deadline on at every attempt; past it, its process is taken for gone.
local Q, W

-- dequeue takes id out of the queue.
local function dequeue(id)
  redis.call('ZREM', Q, id)
  redis.call('HDEL', W, id)
end

-- live returns the channel of id's factory, or removes id if it is stale.
local function live(id, now)
  local _, _, dl, ch = string.find(redis.call('HGET', W, id) or '', '^(%d+):(.*)$')
  if dl and tonumber(dl) > now then return ch end
  dequeue(id)
end

-- ahead counts the live waiters queued before id (all of them if id is not
-- queued), up to n, dropping stale ones from the head.
local function ahead(id, now, n)
  local i = 0
  while i < n do
    local m = redis.call('ZRANGE', Q, i, i)[1]
    if not m or m == id then return i end
    if live(m, now) then i = i + 1 end
  end
  return i
end

-- queue puts id in line, keeping its place if it has one, when it waits
-- (ch, its factory's channel, is not empty), with a deadline ms from now.
local function queue(id, ch, score, now, ms)
  if ch == '' then return end
  redis.call('ZADD', Q, 'NX', score, id)
  redis.call('HSET', W, id, string.format('%d', now + tonumber(ms)) .. ':' .. ch)
  redis.call('PEXPIRE', Q, ms)
  redis.call('PEXPIRE', W, ms)
end

-- wake tells the first live waiter that it is its turn: its id on its
-- factory's channel. With heard '1' (one server has every subscriber: not a
-- cluster) a waiter whose factory no longer listens (its process is gone)
-- is dropped, and the next one told.
local function wake(now, heard)
  while true do
    local m = redis.call('ZRANGE', Q, 0, 0)[1]
    if not m then return end
    local ch = live(m, now)
    if ch then
      if redis.call('PUBLISH', ch, m) > 0 or heard ~= '1' then return end
      dequeue(m)
    end
  end
end

-- clock returns the server time as microseconds (a string) and ms.
local function clock()
  local t = redis.call('TIME')
  return t[1] .. string.sub('00000' .. t[2], -6), tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
