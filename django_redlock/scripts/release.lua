-- Release a Redlock lease on one node: compare-and-delete.
--
-- KEYS[1]  the lock key
-- ARGV[1]  the lease token
--
-- Returns 1 when the key held this token and was deleted, 0 otherwise (absent, expired, or
-- held by another token: another holder's key is never deleted).
-- A release also publishes on the channel named like the lock key, waking the waiters that
-- subscribed to it (they retry at once instead of at their next poll).
-- No `#!lua` shebang on purpose: DEL needs no memory, so a node that is full (maxmemory with
-- noeviction) still lets a holder release; a shebang script without allow-oom would be refused.
if redis.call('HGET', KEYS[1], 't') == ARGV[1] then
    redis.call('DEL', KEYS[1])
    redis.call('PUBLISH', KEYS[1], '1')
    return 1
end
return 0
