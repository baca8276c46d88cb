-- Take a Redlock lease on one node.
--
-- KEYS[1]  the lock key
-- ARGV[1]  the lease token (random, from `secrets`)
-- ARGV[2]  the lease length in milliseconds (positive integer)
-- ARGV[3]  owner metadata (JSON: host, pid, thread, origin, acquired_at); never the token
--
-- Returns the status reply OK when the key now holds this token (newly taken, or already
-- ours from an earlier attempt of the same acquire, in which case its expiry is reset);
-- otherwise an integer: the holder's remaining milliseconds, or -1 when the key has no
-- expiry. A key of another type under our prefix yields a WRONGTYPE error.
--
-- The lock is a hash (t = token, o = owner) so the owner travels with the key, expires with
-- it, and is deleted with it: one key per lock per node, nothing to leak.
-- No `#!lua` shebang: plain EVAL semantics; this script writes, so a full node (OOM) refuses it,
-- which is the right answer for an acquire.
local token = redis.call('HGET', KEYS[1], 't')
if token == false then
    if redis.call('EXISTS', KEYS[1]) == 1 then
        -- Not a hash of ours (or a hash without a token): treat as held, never overwrite.
        return redis.call('PTTL', KEYS[1])
    end
    redis.call('HSET', KEYS[1], 't', ARGV[1], 'o', ARGV[3])
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return {ok = 'OK'}
end
if token == ARGV[1] then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return {ok = 'OK'}
end
return redis.call('PTTL', KEYS[1])
