-- DedupStore::extend, atomically: only the current holder's token extends its lease.
-- KEYS[1] the id's record. ARGV[1] token, ARGV[2] the new lease in milliseconds.
-- Returns 1 when extended, 0 when the token no longer holds the id (the record expired
-- with the lease, or was completed, abandoned or taken over).
local held = redis.call('HMGET', KEYS[1], 's', 't')
if held[1] ~= 'p' or tonumber(held[2]) ~= tonumber(ARGV[1]) then
  return 0
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
