-- Force-release a lock on one node, whoever holds it (operators only: the admin page).
--
-- KEYS[1]  the lock key (waiters listen on channels named after it: see wake_next.lua)
-- KEYS[2]  the lock's wait line (sorted set of waiter ids by ticket)
-- KEYS[3]  the lapse times of the places in line (hash, ms on the node's clock)
--
-- Returns 1 when a key was deleted, 0 when there was none. Wakes the first waiter in line
-- as release.lua does. The evicted holder is not told: only a fencing token (FencedModel)
-- stops its later writes, which is why the admin bumps it too.
-- @include wake_next.lua
if redis.call('DEL', KEYS[1]) == 0 then
    return 0
end
wake_next(KEYS[1], KEYS[2], KEYS[3])
return 1
