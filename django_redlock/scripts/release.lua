-- Release a Redlock lease on one node: compare-and-delete, then hand the lock to the next
-- waiter (hand_grant.lua) or wake it.
--
-- KEYS[1]  the lock key (waiters listen on channels named after it: see wake_next.lua)
-- KEYS[2]  the lock's wait line (sorted set of waiter ids by ticket)
-- KEYS[3]  the lapse times of the places in line (hash, ms on the node's clock)
-- ARGV[1]  the lease token
-- ARGV[2]  the holder's waiter id ("" when it took the lock with a single try)
--
-- Returns 1 when the key held this token and was deleted, 0 otherwise (absent, expired, or
-- held by another token: another holder's key is never deleted).
-- A release grants the lock here to the first waiter in line when that waiter registered a
-- hand-off token (hand_grant.lua: the safety argument), else wakes only that waiter
-- (wake_next.lua): it retries at once, the others keep waiting, so a release costs at most
-- one retry and one wake-up, not one per waiter.
-- No `#!lua` shebang on purpose: DEL needs no memory, so a node that is full (maxmemory with
-- noeviction) still lets a holder release; a shebang script without allow-oom would be refused.
-- @include wake_next.lua
-- @include lock_key.lua
-- @include lock_write.lua
-- @include hand_grant.lua
-- A key of another type under our name (a user's key, an old-layout hash lock) is not ours
-- (lock_key.lua): answer 0 (not held), never a WRONGTYPE error that would hide the loss.
if lock_token(KEYS[1]) ~= ARGV[1] then
    -- Not held here by this lease (expired, or another attempt won this node): still drop
    -- the holder's place in line. If that place headed the line of a free lock, the next
    -- waiter was refused behind it and no other release will come: wake it.
    if ARGV[2] ~= '' and redis.call('ZREM', KEYS[2], ARGV[2]) == 1 then
        redis.call('HDEL', KEYS[3], ARGV[2])
        redis.call('HDEL', KEYS[1] .. '\0h', ARGV[2])
        if redis.call('EXISTS', KEYS[1]) == 0 then
            grant_next(KEYS[1], KEYS[2], KEYS[3])
        end
    end
    return 0
end
redis.call('DEL', KEYS[1])
-- The holder's own place in line may remain on nodes that did not grant it the lock (they
-- queued it, then the others gave it a quorum): drop it, or it would head the line.
if ARGV[2] ~= '' then
    redis.call('ZREM', KEYS[2], ARGV[2])
    redis.call('HDEL', KEYS[3], ARGV[2])
    redis.call('HDEL', KEYS[1] .. '\0h', ARGV[2])
end
grant_next(KEYS[1], KEYS[2], KEYS[3])
return 1
