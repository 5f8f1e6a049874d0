-- RedisStreamDelivery::dead_letter: move the entry to the dead-letter stream, atomically.
-- KEYS[1] the stream, KEYS[2] the dead-letter stream, KEYS[3] the parked nacks.
-- ARGV[1] group, ARGV[2] entry id, ARGV[3] reason, ARGV[4] times delivered.
-- Returns the dead letter's id, or 0 if the entry was no longer pending in the group
-- (already acked or dead-lettered): then nothing changes.
--
-- The dead letter is the entry's fields, untouched, after four fields of its own:
-- oncebox_dead_reason, oncebox_dead_group, oncebox_dead_entry, oncebox_dead_deliveries.
local stream, group, id = KEYS[1], ARGV[1], ARGV[2]
if redis.call('XACK', stream, group, id) == 0 then
  return 0
end
redis.call('HDEL', KEYS[3], id .. '/' .. group)
local fields = {
  'oncebox_dead_reason', ARGV[3],
  'oncebox_dead_group', group,
  'oncebox_dead_entry', id,
  'oncebox_dead_deliveries', ARGV[4],
}
local entry = redis.call('XRANGE', stream, id, id)[1]
if entry then
  for _, value in ipairs(entry[2]) do
    fields[#fields + 1] = value
  end
end
return redis.call('XADD', KEYS[2], '*', unpack(fields))
