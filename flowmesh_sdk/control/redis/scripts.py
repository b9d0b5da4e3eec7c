"""The Lua scripts: each runs atomically on the Redis server, reads the time from the
server (``TIME``), never from a coordinator's clock.

Every lease -- a semaphore permit, a tenant's in-flight slot, a claimed task -- is a
member of a sorted set scored by its expiry in server milliseconds, and is listed in its
coordinator's lease hash (``coord:<id>:leases``, field ``<zset key>\\t<member>``).  A
coordinator's heartbeat pushes every one of its leases forward to its own expiry; a
coordinator that stops heartbeating loses them all at once: they are purged by the next
caller, and the reaper (``adopt``) hands its claimed tasks back to the front of their
queues and its instances to the adopter.

Calls are idempotent where a retry could repeat them (a reply lost on a dropped
connection): a member already granted is reported granted, not granted again.
"""

from __future__ import annotations

_NOW = """
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
-- claimed tasks back to the front of queue ``base``, in the order they were submitted
local function requeue(base, ids)
  local order = {}
  for _, id in ipairs(ids) do order[id] = tonumber(redis.call('HGET', base .. ':order', id) or '0') end
  table.sort(ids, function(x, y) return order[x] < order[y] end)
  for i = #ids, 1, -1 do redis.call('LPUSH', base .. ':ready', ids[i]) end
end
"""

# KEYS: coord key, coords zset, epoch key   ARGV: coord id, lease ms, epoch if none, info
REGISTER = _NOW + """
local now = now_ms()
local ep = redis.call('GET', KEYS[3])
if not ep then redis.call('SET', KEYS[3], ARGV[3]); ep = ARGV[3] end
redis.call('SET', KEYS[1], ARGV[4], 'PX', ARGV[2])
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[2]), ARGV[1])
return {ep, now}
"""

# KEYS: coord key, lease hash, coords zset, epoch key   ARGV: coord id, lease ms, epoch
# -> {n leases renewed, server ms} | {-1} lease lapsed | {-2} state lost (epoch gone or changed)
HEARTBEAT = _NOW + """
local ep = redis.call('GET', KEYS[4])
if ep ~= ARGV[3] then return {-2, 0} end
if redis.call('EXISTS', KEYS[1]) == 0 then return {-1, 0} end
local now = now_ms()
local ms = tonumber(ARGV[2])
local exp = now + ms
redis.call('PEXPIRE', KEYS[1], ms)
redis.call('ZADD', KEYS[3], exp, ARGV[1])
local fields = redis.call('HKEYS', KEYS[2])
for _, f in ipairs(fields) do
  local i = string.find(f, '\\t', 1, true)
  redis.call('ZADD', string.sub(f, 1, i - 1), 'XX', exp, string.sub(f, i + 1))
end
return {#fields, now}
"""

# KEYS: coords zset, adoptions stream   ARGV: the fleet's key prefix, adopter id, fleet
# -> flat list: dead id, leases dropped, tasks requeued, instances adopted, their rows (json), ...
ADOPT = _NOW + """
local now = now_ms()
local ns = ARGV[1]
local out = {}
for _, d in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)) do
  if d ~= ARGV[2] and redis.call('EXISTS', ns .. 'coord:' .. d) == 0 then
    redis.call('ZREM', KEYS[1], d)
    local lkey = ns .. 'coord:' .. d .. ':leases'
    local dropped, requeued, woken, back = 0, 0, {}, {}
    for _, f in ipairs(redis.call('HKEYS', lkey)) do
      local i = string.find(f, '\\t', 1, true)
      local z, m = string.sub(f, 1, i - 1), string.sub(f, i + 1)
      local score = redis.call('ZSCORE', z, m)
      -- only a lease that lapsed with its holder: a claim of the same task id scored in the
      -- future was taken since by a live coordinator and is not the dead one's to give back
      if score and tonumber(score) <= now and redis.call('ZREM', z, m) == 1 then
        dropped = dropped + 1
        if string.sub(z, -8) == ':claimed' then
          local base = string.sub(z, 1, -9)
          if redis.call('HEXISTS', base .. ':tasks', m) == 1 then
            back[base] = back[base] or {}
            table.insert(back[base], m)
            requeued = requeued + 1
            woken[base .. ':ready'] = true
          end
        else
          woken[z] = true
        end
      end
    end
    for base, ids in pairs(back) do requeue(base, ids) end
    for ch, _ in pairs(woken) do redis.call('PUBLISH', ch, 'adopt') end
    redis.call('DEL', lkey)
    local ikey = ns .. 'coord:' .. d .. ':instances'
    local insts, listed = redis.call('SMEMBERS', ikey), {}
    -- a coordinator leaving cleanly ('-') keeps what it could not terminate: listed under
    -- its name, with no lease behind it, for ``flowmesh gc``
    if ARGV[2] == '-' then insts = {} end
    for _, id in ipairs(insts) do
      redis.call('HSET', ns .. 'holder', id, ARGV[2])
      redis.call('SADD', ns .. 'coord:' .. ARGV[2] .. ':instances', id)
      local row = cjson.decode(redis.call('HGET', ns .. 'instances', id) or '{}')
      row['id'] = id; row['fleet'] = ARGV[3]
      table.insert(listed, row)
    end
    if ARGV[2] ~= '-' then   -- '-': a coordinator leaving cleanly, not an adoption
      redis.call('DEL', ikey)
      redis.call('XADD', KEYS[2], 'MAXLEN', '~', 1000, '*', 'dead', d, 'adopter', ARGV[2],
                 'leases', dropped, 'tasks', requeued, 'instances', #insts, 'at_ms', now)
    end
    table.insert(out, d); table.insert(out, dropped); table.insert(out, requeued); table.insert(out, #insts)
    table.insert(out, #listed > 0 and cjson.encode(listed) or '[]')
  end
end
return out
"""

# KEYS: holders zset, lease hash, coord key   ARGV: capacity, member...
# -> {granted (a prefix of the members), ms until the earliest lease expires or 0} | {-1, 0}
SEM_ACQUIRE = _NOW + """
if redis.call('EXISTS', KEYS[3]) == 0 then return {-1, 0} end
local now = now_ms()
local exp = now + redis.call('PTTL', KEYS[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local cap = tonumber(ARGV[1])
local n = redis.call('ZCARD', KEYS[1])
local got = 0
for i = 2, #ARGV do
  local m = ARGV[i]
  if redis.call('ZSCORE', KEYS[1], m) then
    got = got + 1
  elseif n < cap then
    redis.call('ZADD', KEYS[1], exp, m)
    redis.call('HSET', KEYS[2], KEYS[1] .. '\\t' .. m, 1)
    n = n + 1
    got = got + 1
  else
    break
  end
end
local wait = 0
if got < #ARGV - 1 then
  local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  if first[2] then wait = math.max(1, tonumber(first[2]) - now) end
end
return {got, wait}
"""

# KEYS: zset, lease hash   ARGV: channel ('' for none), member...   -> removed
RELEASE = """
local removed = 0
for i = 2, #ARGV do
  removed = removed + redis.call('ZREM', KEYS[1], ARGV[i])
  redis.call('HDEL', KEYS[2], KEYS[1] .. '\\t' .. ARGV[i])
end
if removed > 0 and ARGV[1] ~= '' then redis.call('PUBLISH', ARGV[1], removed) end
return removed
"""

# KEYS: holders zset   -> live holders
SEM_COUNT = _NOW + """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now_ms())
return redis.call('ZCARD', KEYS[1])
"""

# KEYS: in-flight zset, total counter, lease hash, coord key
# ARGV: max in flight (-1: none), max total, member, pinned ('1': the slot belongs to a queued
# task, not to this coordinator: it outlives it and is freed when the task is acked)
# -> {1, in flight, total} | {0, 1 (in flight) | 2 (total), count} | {-1}
QUOTA_ADMIT = _NOW + """
if redis.call('EXISTS', KEYS[4]) == 0 then return {-1, 0, 0} end
local now = now_ms()
if redis.call('ZSCORE', KEYS[1], ARGV[3]) then return {1, 0, 0} end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local n = redis.call('ZCARD', KEYS[1])
local lim = tonumber(ARGV[1])
if lim >= 0 and n >= lim then return {0, 1, n} end
local t = tonumber(redis.call('GET', KEYS[2]) or '0')
local tot = tonumber(ARGV[2])
if tot >= 0 and t >= tot then return {0, 2, t} end
if ARGV[4] == '1' then
  redis.call('ZADD', KEYS[1], '+inf', ARGV[3])
else
  redis.call('ZADD', KEYS[1], now + redis.call('PTTL', KEYS[4]), ARGV[3])
  redis.call('HSET', KEYS[3], KEYS[1] .. '\\t' .. ARGV[3], 1)
end
redis.call('INCR', KEYS[2])
return {1, n + 1, t + 1}
"""

# KEYS: bucket hash   ARGV: rate per s, burst, tokens   -> {1, tokens left} | {0, ms to wait, tokens}
BUCKET_TAKE = _NOW + """
local now = now_ms()
local rate, burst, want = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local b = redis.call('HMGET', KEYS[1], 'tokens', 'stamp')
local tokens = tonumber(b[1]) or burst
local stamp = tonumber(b[2]) or now
tokens = math.min(burst, tokens + math.max(0, now - stamp) * rate / 1000)
local ok = 0
local wait = 0
if tokens >= want then
  tokens = tokens - want
  ok = 1
else
  wait = math.ceil((want - tokens) * 1000 / rate)
end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'stamp', now)
redis.call('PEXPIRE', KEYS[1], math.ceil(burst * 1000 / rate) + 60000)
return {ok, wait, tostring(tokens)}
"""

# KEYS: ready list, tasks hash, order hash, sequence   ARGV: channel, id, payload, ...
# -> pushed (duplicates of an id are ignored)
Q_PUSH = """
local pushed = 0
for i = 2, #ARGV, 2 do
  if redis.call('HSETNX', KEYS[2], ARGV[i], ARGV[i + 1]) == 1 then
    redis.call('HSET', KEYS[3], ARGV[i], redis.call('INCR', KEYS[4]))
    redis.call('RPUSH', KEYS[1], ARGV[i])
    pushed = pushed + 1
  end
end
if pushed > 0 then redis.call('PUBLISH', ARGV[1], pushed) end
return pushed
"""

# KEYS: ready, tasks, claimed zset, attempts hash, lease hash, coord key, request key
# ARGV: n, queue base, request ms   -> flat list: id, payload, attempt, ...  | {-1}
# The request key (one per claim call, kept ``request ms``) makes a retried call -- its
# reply lost on a dropped connection -- return what the first one claimed, not claim more
# and leave those held, unseen, under this coordinator's live lease.
Q_CLAIM = _NOW + """
if redis.call('EXISTS', KEYS[6]) == 0 then return {-1} end
local out = {}
local prev = redis.call('GET', KEYS[7])
if prev then
  for _, id in ipairs(cjson.decode(prev)) do
    local p = redis.call('HGET', KEYS[2], id)
    if p and redis.call('ZSCORE', KEYS[3], id) then
      table.insert(out, id); table.insert(out, p); table.insert(out, tonumber(redis.call('HGET', KEYS[4], id)))
    end
  end
  return out
end
local now = now_ms()
local exp = now + redis.call('PTTL', KEYS[6])
local late, back = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now), {}
for _, id in ipairs(late) do
  redis.call('ZREM', KEYS[3], id)
  if redis.call('HEXISTS', KEYS[2], id) == 1 then table.insert(back, id) end
end
requeue(ARGV[2], back)
local ids = {}
for _ = 1, tonumber(ARGV[1]) do
  local id = redis.call('LPOP', KEYS[1])
  if not id then break end
  local p = redis.call('HGET', KEYS[2], id)
  if p then
    redis.call('ZADD', KEYS[3], exp, id)
    redis.call('HSET', KEYS[5], KEYS[3] .. '\\t' .. id, 1)
    table.insert(ids, id)
    table.insert(out, id); table.insert(out, p); table.insert(out, redis.call('HINCRBY', KEYS[4], id, 1))
  end
end
if #ids > 0 then redis.call('SET', KEYS[7], cjson.encode(ids), 'PX', ARGV[3]) end
return out
"""

# KEYS: claimed, tasks, attempts, lease hash, order hash   ARGV: id, tenant slot zset ('' for none), ...
# -> acked (the task's tenant slot, pinned at submission, is freed in the same step)
Q_ACK = """
local n = 0
for i = 1, #ARGV, 2 do
  redis.call('ZREM', KEYS[1], ARGV[i])
  n = n + redis.call('HDEL', KEYS[2], ARGV[i])
  redis.call('HDEL', KEYS[3], ARGV[i])
  redis.call('HDEL', KEYS[5], ARGV[i])
  redis.call('HDEL', KEYS[4], KEYS[1] .. '\\t' .. ARGV[i])
  if ARGV[i + 1] ~= '' then redis.call('ZREM', ARGV[i + 1], ARGV[i]) end
end
return n
"""

# KEYS: claimed, ready, lease hash   ARGV: channel, id...   -> given back to the front of the queue
Q_NACK = """
local n = 0
for i = #ARGV, 2, -1 do
  if redis.call('ZREM', KEYS[1], ARGV[i]) == 1 then
    redis.call('LPUSH', KEYS[2], ARGV[i])
    n = n + 1
  end
  redis.call('HDEL', KEYS[3], KEYS[1] .. '\\t' .. ARGV[i])
end
if n > 0 then redis.call('PUBLISH', ARGV[1], n) end
return n
"""

# KEYS: the old layout's ready, tasks, claimed, attempts, order, seq and coords; this queue's
#       ready, tasks, attempts, order, seq
# ARGV: channel (this queue's ready list), the old layout's prefix
# -> {moved, live coordinators of the old layout, tasks left there}
# Tasks an older version queued under ``<namespace>:q:<name>`` (no fleet in the keys) move to
# the front of this fleet's queue of that name, in submission order, claimed ones too --
# unless a coordinator of the old layout still holds a lease (it may be running them).
Q_MIGRATE = """
local live = 0
for _, c in ipairs(redis.call('ZRANGE', KEYS[7], 0, -1)) do
  if redis.call('EXISTS', ARGV[2] .. 'coord:' .. c) == 1 then live = live + 1 end
end
local left = redis.call('HLEN', KEYS[2])
if live > 0 or left == 0 then return {0, live, left} end
local ids = redis.call('HKEYS', KEYS[2])
local order = {}
for _, id in ipairs(ids) do order[id] = tonumber(redis.call('HGET', KEYS[5], id) or '0') end
table.sort(ids, function(x, y) return order[x] < order[y] end)
local moved = 0
for i = #ids, 1, -1 do
  local id = ids[i]
  if redis.call('HSETNX', KEYS[9], id, redis.call('HGET', KEYS[2], id)) == 1 then
    redis.call('HSET', KEYS[11], id, redis.call('INCR', KEYS[12]))
    local a = redis.call('HGET', KEYS[4], id)
    if a then redis.call('HSET', KEYS[10], id, a) end
    redis.call('LPUSH', KEYS[8], id)
    moved = moved + 1
  end
end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6])
if moved > 0 then redis.call('PUBLISH', ARGV[1], moved) end
return {moved, 0, 0}
"""

# KEYS: charges hash, instances hash, holder hash, coord instances set (of the fleet's keys)
# ARGV: fleet, id, coord, charge json (without times), instance json   -- started at server time
CHARGE_START = _NOW + """
local c = cjson.decode(ARGV[4])
c['started_ms'] = now_ms()
redis.call('HSETNX', KEYS[1], ARGV[2], cjson.encode(c))
redis.call('HSET', KEYS[2], ARGV[2], ARGV[5])
redis.call('HSET', KEYS[3], ARGV[2], ARGV[3])
redis.call('SADD', KEYS[4], ARGV[2])
return 1
"""

# KEYS: charges hash, instances hash, holder hash, coord instances set   ARGV: fleet, id
CHARGE_END = _NOW + """
local raw = redis.call('HGET', KEYS[1], ARGV[2])
if raw then
  local c = cjson.decode(raw)
  if not c['ended_ms'] then c['ended_ms'] = now_ms(); redis.call('HSET', KEYS[1], ARGV[2], cjson.encode(c)) end
end
redis.call('HDEL', KEYS[2], ARGV[2])
redis.call('HDEL', KEYS[3], ARGV[2])
redis.call('SREM', KEYS[4], ARGV[2])
return 1
"""

# KEYS: charges hash   -> {server ms, field, value, ...}
CHARGES = _NOW + """
local out = {now_ms()}
for _, v in ipairs(redis.call('HGETALL', KEYS[1])) do table.insert(out, v) end
return out
"""

ALL = {name: src for name, src in globals().items() if name.isupper() and not name.startswith("_")
       and name != "ALL"}
