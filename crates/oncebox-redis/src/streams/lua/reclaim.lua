-- RedisStreamSubscriber: take over the group's deliveries left unsettled for the ack
-- timeout, honouring nacks parked for longer than it.
-- KEYS[1] the stream, KEYS[2] the parked nacks (a hash: "<entry id>/<group>" -> due, ms).
-- ARGV[1] group, ARGV[2] consumer, ARGV[3] ack timeout (ms), ARGV[4] cursor,
-- ARGV[5] count.
-- Returns {next cursor, {{id, {field, value, ...}, times delivered}, ...},
--          {{id, ms until it is due again}, ...}}.
--
-- XAUTOCLAIM with JUSTID takes the idle entries without counting a delivery; each is
-- then either parked again (its nack asked for a later time) or claimed with XCLAIM,
-- which counts the delivery and returns the entry.
local stream, parked_key = KEYS[1], KEYS[2]
local group, consumer, ack_timeout = ARGV[1], ARGV[2], tonumber(ARGV[3])
local scan = redis.call('XAUTOCLAIM', stream, group, consumer, ack_timeout, ARGV[4],
  'COUNT', ARGV[5], 'JUSTID')
local claimed, parked = {}, {}
local now
for _, id in ipairs(scan[2]) do
  local field = id .. '/' .. group
  local due = redis.call('HGET', parked_key, field)
  local wait = 0
  if due then
    if not now then
      local time = redis.call('TIME')
      now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
    end
    wait = tonumber(due) - now
    if wait <= 0 then
      redis.call('HDEL', parked_key, field)
    end
  end
  if wait > 0 then
    local step = math.min(wait, ack_timeout)
    redis.call('XCLAIM', stream, group, consumer, 0, id, 'IDLE', ack_timeout - step, 'JUSTID')
    parked[#parked + 1] = {id, step}
  else
    local entry = redis.call('XCLAIM', stream, group, consumer, 0, id)[1]
    if entry then
      local pending = redis.call('XPENDING', stream, group, id, id, 1)[1]
      claimed[#claimed + 1] = {entry[1], entry[2], pending and pending[4] or 1}
    end
  end
end
-- Entries deleted (trimmed) while pending: XAUTOCLAIM dropped them from the group.
if scan[3] then
  for _, id in ipairs(scan[3]) do
    redis.call('HDEL', parked_key, id .. '/' .. group)
  end
end
return {scan[1], claimed, parked}
