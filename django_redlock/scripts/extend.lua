-- Extend a Redlock lease on one node: compare-and-pexpire.
--
-- KEYS[1]  the lock key
-- ARGV[1]  the lease token
-- ARGV[2]  the new lease length in milliseconds (positive integer), counted from now
--
-- Returns 1 when the key held this token and its expiry was reset, 0 otherwise. An absent key
-- is never re-created: a lease that expired on this node stays expired (lease continuity).
if redis.call('HGET', KEYS[1], 't') == ARGV[1] then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return 1
end
return 0
