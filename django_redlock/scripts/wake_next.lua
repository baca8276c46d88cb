-- Included by release.lua and force_release.lua (see `_script` in redlock.py): wake the
-- first waiter in line of a lock that just became free.
--
-- A waiter id is "<listener>.<nonce>": <listener> names the pub/sub channel of the waiting
-- thread (lock key .. "\0w" .. listener), <nonce> this one acquire. Only the head of the line
-- hears the release, so a hand-off wakes one process, not every waiter (which would cost a
-- wake-up per waiter per node, per release). Waiters whose place lapsed are dropped here.
-- A waiter that misses the message (node down, not yet subscribed) retries at its poll delay.
local function wake_next(key, line, lapse)
    -- Nobody waits (no line): nothing to publish. Waiters always queue before they listen.
    if redis.call('EXISTS', line) == 0 then
        return
    end
    local time = redis.call('TIME')
    local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
    for _ = 1, 32 do
        local first = redis.call('ZRANGE', line, 0, 0)
        if #first == 0 then
            return
        end
        if tonumber(redis.call('HGET', lapse, first[1]) or '0') > now then
            -- A reader or writer of the read-write lock of this name queues as "r|"/"w|" and
            -- its waiter id (wait_line.lua).
            local waiter = string.match(first[1], '^[rw]|(.*)$') or first[1]
            local listener = string.match(waiter, '^([^.]+)%.')
            if listener ~= nil then
                redis.call('PUBLISH', key .. '\0w' .. listener, waiter)
            end
            return
        end
        redis.call('ZREM', line, first[1])
        redis.call('HDEL', lapse, first[1])
    end
end
