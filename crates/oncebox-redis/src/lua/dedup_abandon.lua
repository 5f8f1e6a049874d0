-- DedupStore::abandon, atomically: only the current holder's token frees the id.
-- KEYS[1] the id's record. ARGV[1] token.
-- Returns 1 when freed, 0 when the token no longer holds the id.
local held = redis.call('HMGET', KEYS[1], 's', 't')
if held[1] ~= 'p' or tonumber(held[2]) ~= tonumber(ARGV[1]) then
  return 0
end
redis.call('DEL', KEYS[1])
return 1
