-- Leave a lock's wait line (a blocking acquire that gave up or got the lock elsewhere).
--
-- KEYS[1]  the lock key (waiters listen on channels named after it: see wake_next.lua)
-- KEYS[2]  the lock's wait line (sorted set)
-- KEYS[3]  the lapse times of the places in line (hash)
-- ARGV[1]  the waiter id
--
-- Returns 1 when the waiter was in line here, 0 otherwise. When the lock is free here, the
-- waiter now at the head is woken: it may have tried while the leaver was still ahead of it
-- and been refused, and no release is coming to wake it.
-- @include wake_next.lua
redis.call('HDEL', KEYS[3], ARGV[1])
local removed = redis.call('ZREM', KEYS[2], ARGV[1])
if removed == 1 and redis.call('EXISTS', KEYS[1]) == 0 then
    wake_next(KEYS[1], KEYS[2], KEYS[3])
end
return removed
