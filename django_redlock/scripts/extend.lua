-- Renew a Redlock lease on one node: compare-and-pexpire, or re-create a key this node lost.
--
-- KEYS[1]  the lock key (a lock, a write lease, a semaphore slot)
-- KEYS[2]  the readers of the read-write lock of the same name (KEYS[1] .. "\0r", readers.lua)
-- ARGV[1]  the lease token
-- ARGV[2]  the new lease length in milliseconds (positive integer), counted from now
-- ARGV[3]  the owner (lock_key.lua), stored when the key is re-created and used to keep its
--          owner key alive as long as the key; never the token
-- ARGV[4]  only from a client with the node setting REPLICA_ACKS (appended by the transport,
--          wire/acks.py): its REPLICA_ACKS; ARGV[5] the replica count its WAIT asks for. The
--          renewal is then refused, before anything is written, when that count is not the
--          one replica_acks.lua asks for (a renewal an unwaited replica lacks would leave a
--          promoted replica with the older expiry). Absent for every other client: a renewal
--          costs nothing more then.
--
-- Returns 1 when the key held this token and its expiry was reset; 2 when the key was absent
-- and is now re-created for this token; -1 when another holder has taken its place here
-- (another token, a key of another type, or live readers where the key is gone), and then
-- nothing is written. The client judges the round (core/flow.py, judge_extend).
--
-- Why re-create (issue 22): a node that restarts without its data forgets the key. The
-- restart quarantine keeps it from voting for max_ttl, which covers every lease that ends
-- within max_ttl, but not one that is renewed: without re-creation each restart takes a key
-- away for good, and once a majority of nodes restarted (a rolling restart of non-durable
-- nodes) a rival wins them while the holder's validity still runs (found by
-- tests/core/test_fault_storm.py). So every renewal puts the key back where it is missing,
-- at once, quarantine or not: the quarantine protects other holders' forgotten keys, and
-- while this lease is valid there is no other holder of this name to protect.
--
-- Why it is safe: the client counts the round only if its replies arrive while the lease is
-- valid, and counts a re-created key only when the keys the lease already had (renewed here
-- or on nodes that did not answer) can still make a quorum: then no other client can hold a
-- quorum of this name, and setting our key where it is absent is what our acquire's SET NX
-- arriving late would have done, which Redlock already allows. Otherwise (an operator's
-- force release, keys gone from a quorum) the lease is lost and the client deletes the keys
-- it re-created. A key held by anyone else is never touched.
-- @include lock_key.lua
-- @include lock_write.lua
-- @include replica_acks.lua
local key, token, ttl = KEYS[1], ARGV[1], ARGV[2]
if ARGV[4] ~= nil then
    local claimed = redis.call('HGET', '\0django_redlock:node', 'a')
    local unacknowledged = replica_acks('\0django_redlock:node', claimed, ARGV[4], ARGV[5])
    if unacknowledged ~= nil then
        return redis.error_reply(unacknowledged)
    end
end
local held = lock_token(key)
if held == token then
    redis.call('PEXPIRE', key, ttl)
    keep_owner_of(key, ARGV[3], tonumber(ttl))
    return 1
end
if held then
    return -1 -- another token, or a key that is not a lock of ours: never overwritten
end
if redis.call('EXISTS', KEYS[2]) == 1 then
    -- Live readers (their expiry is their score, ms on this node's clock: readers.lua).
    local last = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
    local time = redis.call('TIME')
    local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
    if #last == 2 and tonumber(last[2]) > now then
        return -1
    end
end
set_lock(key, token, ARGV[3], ttl)
return 2
