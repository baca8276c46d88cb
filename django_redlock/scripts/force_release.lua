-- Force-release a lock on one node, whoever holds it (operators only: the admin page).
--
-- KEYS[1]  the lock key (also the channel waiters listen on)
-- KEYS[2]  the lock's wait line (sorted set of waiter ids by ticket)
-- KEYS[3]  the lapse times of the places in line (hash, ms on the node's clock)
--
-- Returns 1 when a key was deleted, 0 when there was none. Wakes the first waiter in line
-- as release.lua does. The evicted holder is not told: only a fencing token (FencedModel)
-- stops its later writes, which is why the admin bumps it too.
if redis.call('DEL', KEYS[1]) == 0 then
    return 0
end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local next_waiter = ''
for _ = 1, 32 do
    local first = redis.call('ZRANGE', KEYS[2], 0, 0)
    if #first == 0 then
        break
    end
    if tonumber(redis.call('HGET', KEYS[3], first[1]) or '0') > now then
        next_waiter = first[1]
        break
    end
    redis.call('ZREM', KEYS[2], first[1])
    redis.call('HDEL', KEYS[3], first[1])
end
redis.call('PUBLISH', KEYS[1], next_waiter)
return 1
