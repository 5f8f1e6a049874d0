-- DedupStore::inspect, atomically: the record and its expiry read in one step.
-- KEYS[1] the id's record.
-- Returns {state, token, result, ms left (PTTL)}, a missing field as nil, or nil if
-- there is no record (never seen, abandoned, or expired with its lease or TTL).
local held = redis.call('HMGET', KEYS[1], 's', 't', 'r')
if not held[1] then
  return false
end
return {held[1], held[2], held[3], redis.call('PTTL', KEYS[1])}
