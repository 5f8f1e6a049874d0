-- DedupStore::complete, atomically: only the current holder's token completes.
-- KEYS[1] the id's record. ARGV[1] token, ARGV[2] result, ARGV[3] TTL in milliseconds.
-- Returns 1 when completed, 0 when the token no longer holds the id.
local held = redis.call('HMGET', KEYS[1], 's', 't')
if held[1] ~= 'p' or tonumber(held[2]) ~= tonumber(ARGV[1]) then
  return 0
end
redis.call('HSET', KEYS[1], 's', 'c', 'r', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
