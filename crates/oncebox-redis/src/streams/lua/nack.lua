-- RedisStreamDelivery::nack: make the entry due again after a delay.
-- KEYS[1] the stream, KEYS[2] the parked nacks (a hash: "<entry id>/<group>" -> due, ms).
-- ARGV[1] group, ARGV[2] consumer, ARGV[3] entry id, ARGV[4] times delivered as this
-- delivery saw it, ARGV[5] idle time to set (ms), ARGV[6] delay beyond the ack timeout
-- (ms, 0 for none).
-- Returns 1, or 0 if this delivery no longer holds the entry (acked, or claimed again
-- since): then nothing changes.
--
-- Redis redelivers an entry once it has been idle for the ack timeout, so setting its
-- idle time to (ack timeout - delay) makes it due after the delay. A longer delay is
-- parked: the entry becomes idle at once, and whoever reclaims it before the due time
-- parks it again (reclaim.lua).
local stream, group, id = KEYS[1], ARGV[1], ARGV[3]
local pending = redis.call('XPENDING', stream, group, id, id, 1)[1]
if not pending or pending[2] ~= ARGV[2] or pending[4] ~= tonumber(ARGV[4]) then
  return 0
end
redis.call('XCLAIM', stream, group, ARGV[2], 0, id, 'IDLE', ARGV[5], 'JUSTID')
local field = id .. '/' .. group
local beyond = tonumber(ARGV[6])
if beyond > 0 then
  local time = redis.call('TIME')
  local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
  redis.call('HSET', KEYS[2], field, string.format('%.0f', now + beyond))
else
  redis.call('HDEL', KEYS[2], field)
end
return 1
