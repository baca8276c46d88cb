-- Take a Redlock lease on one node.
--
-- KEYS[1]  the lock key
-- KEYS[2]  the node's epoch marker (one per node, never expires, never a user lock name)
-- ARGV[1]  the lease token (random, from `secrets`)
-- ARGV[2]  the lease length in milliseconds (positive integer)
-- ARGV[3]  owner metadata (JSON: host, pid, thread, task, origin, acquired_at); never the token
-- ARGV[4]  the restart quarantine in milliseconds (the longest lease any client may hold)
--
-- Returns the status reply OK when the key now holds this token (newly taken, or already
-- ours from an earlier attempt of the same acquire, in which case its expiry is reset);
-- otherwise an integer: the holder's remaining milliseconds, or -1 when the key has no
-- expiry. A key of another type under our prefix yields a WRONGTYPE error.
-- Returns the error QUARANTINED while the node is within the quarantine after losing its
-- memory (see below): its vote does not count.
--
-- Restart quarantine (the Redis distlock page's "delayed restarts", enforced here so every
-- client agrees, even one started after the crash): a node that restarted without its data
-- forgot the locks it granted, so it must not vote until every lease it may have held has
-- run out. The marker holds the node's own clock (ms) from when it was first seen without
-- the marker; a node whose data survives restarts (appendfsync always) keeps the marker and
-- is never quarantined. Operators declare brand-new nodes fresh by setting the marker to 0.
--
-- The lock is a hash (t = token, o = owner) so the owner travels with the key, expires with
-- it, and is deleted with it: one key per lock per node, nothing to leak.
-- No `#!lua` shebang: plain EVAL semantics; this script writes, so a full node (OOM) refuses it,
-- which is the right answer for an acquire.
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local epoch = redis.call('GET', KEYS[2])
if epoch == false then
    redis.call('SET', KEYS[2], string.format('%d', now))
    epoch = now
end
local age = now - tonumber(epoch)
if age < tonumber(ARGV[4]) then
    return redis.error_reply(
        'QUARANTINED node lost its data ' .. age .. ' ms ago; it votes again in '
        .. (tonumber(ARGV[4]) - age) .. ' ms')
end

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
