-- Leave a lock's wait line (a blocking acquire that gave up or got the lock elsewhere).
--
-- KEYS[1]  the lock key (waiters listen on channels named after it: see wake_next.lua)
-- KEYS[2]  the lock's wait line (sorted set)
-- KEYS[3]  the lapse times of the places in line (hash)
-- ARGV[1]  the waiter id
-- ARGV[2]  the waiter's hand-off token ("" or absent: none; hand_register.lua)
-- ARGV[3]  "1": a try of this waiter sent here may not have run yet (its reply was not
--          heard): leave the gone mark of its token ARGV[2], which refuses that try when it
--          runs late (hand_gone.lua). "" or absent: none (every try here was answered).
--
-- Returns 1 when the waiter was in line here, 0 otherwise. When the lock is free here, the
-- waiter now at the head is granted it (hand_grant.lua) or woken: it may have tried while
-- the leaver was still ahead of it and been refused, and no release is coming to wake it.
-- A waiter that takes hand-off grants leaves with its token: the lock is deleted here if it
-- holds that token (granted, or taken by one of its tries, whether or not a reply said so).
-- No `#!lua` shebang, as release.lua: leaving needs no memory (a grant to the next waiter
-- does; hand_grant.lua wakes it instead when the node is out of memory).
-- @include wake_next.lua
-- @include lock_key.lua
-- @include lock_write.lua
-- @include node_identity.lua
-- @include hand_grant.lua
-- @include hand_gone.lua
local freed = false
local token = ARGV[2] or ''
if token ~= '' and lock_token(KEYS[1]) == token then
    redis.call('DEL', KEYS[1])
    freed = true
end
redis.call('HDEL', KEYS[3], ARGV[1])
redis.call('HDEL', KEYS[1] .. '\0h', ARGV[1])
if ARGV[3] == '1' and token ~= '' then
    pcall(redis.call, 'SET', KEYS[1] .. '\0x' .. token, '1', 'PX', GONE_MS)
end
local removed = redis.call('ZREM', KEYS[2], ARGV[1])
if (removed == 1 or freed) and redis.call('EXISTS', KEYS[1]) == 0 then
    grant_next(KEYS[1], KEYS[2], KEYS[3])
end
return removed
