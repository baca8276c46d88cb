-- Leave a lock's wait line (a blocking acquire that gave up or got the lock elsewhere).
--
-- KEYS[1]  the lock's wait line (sorted set)
-- KEYS[2]  the lapse times of the places in line (hash)
-- ARGV[1]  the waiter id
--
-- Returns 1 when the waiter was in line here, 0 otherwise. Publishes on nothing: the next
-- waiter's poll, or the holder's release, moves the line on.
redis.call('HDEL', KEYS[2], ARGV[1])
return redis.call('ZREM', KEYS[1], ARGV[1])
