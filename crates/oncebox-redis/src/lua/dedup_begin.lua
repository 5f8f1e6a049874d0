-- DedupStore::begin, atomically.
-- KEYS[1] the id's record (a hash), KEYS[2] the fencing-token counter.
-- ARGV[1] the lease in milliseconds.
-- Returns {0, token} started, {1, ms left on the holder's lease} in progress,
-- {2, result} completed.
--
-- The record's own expiry is the state's deadline: the lease while in progress, the TTL
-- once completed. An expired record is absent to Redis, so the id is free again. A record
-- in no known state is replaced as if absent.
local held = redis.call('HMGET', KEYS[1], 's', 'r')
if held[1] == 'c' then
  return {2, held[2] or ''}
end
if held[1] == 'p' then
  local left = redis.call('PTTL', KEYS[1])
  -- A lease without an expiry (the record was edited by hand) would never end: it is
  -- taken over below like an expired one, and its holder is fenced by the new token.
  if left >= 0 then
    return {1, left}
  end
end
local token = redis.call('INCR', KEYS[2])
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 's', 'p', 't', token)
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return {0, token}
