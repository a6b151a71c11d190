-- The packing pass's change of one flow it read (states.lua is prepended): a finished flow is compacted
-- (its cold fields and its log become one compressed value) and gets its end; a flow listed that is
-- going again is taken off the list.
-- KEYS: flow, log, the partition's finished set, a scratch key in the flow's slot (Keys.packing).
-- ARGV: 1 flow id, 2 the version it was read at, 3 the fields to keep plain (JSON object of strings),
-- 4 the record's end, milliseconds from now (workflows/engine/compact.py: its retention, or until its customer
-- can no longer pay), 5.. the packed value in chunks (bytes), stored as fields z, z1,
-- z2... (each short enough for Redis to keep the hash as a compact listpack).
-- Returns the record's time to live in milliseconds when it was packed (never shorter than it had:
-- its lookups get as long), or 0:
-- * the record is gone: off the list;
-- * it is packed already (another pass packed it since it was read): left listed, for the pass that
--   reads it packed to give its lookups their end and unlist it (unlist.lua);
-- * it changed since it was read: left as it is, and listed, for the next pass to read anew;
-- * it is going again (a late payment, a retry), as it was read: off the list (the caller, having
--   read it so, kept its lookups first).
-- A flow packed here stays listed: it is unlisted (unlist.lua) only once its lookups have their end, so
-- a pass cut in between (a dispatcher killed) leaves it for the next, which gives them one.
--
-- Packing moves the version, as every change does: a writer that read the flow before (an operator's
-- retry) finds it changed and reads it again, unpacking it; a compare-and-set that passed on the
-- packed hash would write its change beside the packed fields, deleting nothing of theirs.
--
-- The packed record is written anew, under the scratch key, then renamed over the record: a hash that
-- once held a long field stays a hashtable however many fields are removed, and only a new one is a
-- listpack. Nothing is deleted before the new record exists: in a Redis Cluster whose slot is moving, a
-- node refuses a script that would create a key it does not hold (TRYAGAIN before it runs, as the
-- scratch key is declared), while a refusal half-way through a script keeps what it wrote before.
local data = redis.call('HMGET', KEYS[1], 'version', 'state', 'z')
if not data[1] then
  redis.call('ZREM', KEYS[3], ARGV[1])
  return 0
end
if data[3] then
  return 0
end
if data[1] ~= ARGV[2] then
  return 0
end
if not TERMINAL[data[2]] then
  redis.call('ZREM', KEYS[3], ARGV[1])
  return 0
end
redis.call('DEL', KEYS[4])
-- The new record in one HSET: the plain fields (its version moved), then the chunks.
local written = {'version', tonumber(data[1]) + 1}
for name, value in pairs(cjson.decode(ARGV[3])) do
  if name ~= 'version' then
    table.insert(written, name)
    table.insert(written, value)
  end
end
for i = 5, #ARGV do
  local name = 'z'
  if i > 5 then
    name = 'z' .. (i - 5)
  end
  table.insert(written, name)
  table.insert(written, ARGV[i])
end
redis.call('HSET', KEYS[4], unpack(written))
local ttl = math.max(redis.call('PTTL', KEYS[1]), tonumber(ARGV[4]), 1)
redis.call('RENAME', KEYS[4], KEYS[1])
redis.call('PEXPIRE', KEYS[1], ttl)
redis.call('DEL', KEYS[2])
return ttl
