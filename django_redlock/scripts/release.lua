-- Release a Redlock lease on one node: compare-and-delete, then wake the next waiter.
--
-- KEYS[1]  the lock key (also the name of the channel waiters listen on)
-- KEYS[2]  the lock's wait line (sorted set of waiter ids by ticket)
-- KEYS[3]  the lapse times of the places in line (hash, ms on the node's clock)
-- ARGV[1]  the lease token
-- ARGV[2]  the holder's waiter id ("" when it took the lock with a single try)
--
-- Returns 1 when the key held this token and was deleted, 0 otherwise (absent, expired, or
-- held by another token: another holder's key is never deleted).
-- A release publishes the id of the first waiter in line (or "" when nobody waits) on the
-- lock's channel: only that waiter retries at once, the others keep waiting, so a release
-- costs one retry, not one per waiter.
-- No `#!lua` shebang on purpose: DEL needs no memory, so a node that is full (maxmemory with
-- noeviction) still lets a holder release; a shebang script without allow-oom would be refused.
if redis.call('HGET', KEYS[1], 't') ~= ARGV[1] then
    if ARGV[2] ~= '' then
        redis.call('ZREM', KEYS[2], ARGV[2])
        redis.call('HDEL', KEYS[3], ARGV[2])
    end
    return 0
end
redis.call('DEL', KEYS[1])
-- The holder's own place in line may remain on nodes that did not grant it the lock (they
-- queued it, then the others gave it a quorum): drop it, or it would head the line.
if ARGV[2] ~= '' then
    redis.call('ZREM', KEYS[2], ARGV[2])
    redis.call('HDEL', KEYS[3], ARGV[2])
end
-- Nobody waits (no line): nothing to publish. Waiters always queue before they listen.
if redis.call('EXISTS', KEYS[2]) == 0 then
    return 1
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
