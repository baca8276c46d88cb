-- Included by release.lua, leave.lua and force_release.lua (see `_script` in redlock.py):
-- wake the first waiter in line of a lock that just became free.
--
-- A waiter id is "<listener>.<nonce>": <listener> names the pub/sub channel of the waiting
-- thread (lock key .. "\0w" .. listener), <nonce> this one acquire. Only the head of the line
-- hears the release, so a hand-off wakes one process, not every waiter (which would cost a
-- wake-up per waiter per node, per release). Waiters whose place lapsed are dropped here.
-- A waiter that misses the message (node down, not yet subscribed) retries at its poll delay.
-- release.lua first tries to grant the lock to that head outright (hand_grant.lua); the
-- wake-up is what every other head gets (a reader or writer of the read-write lock of this
-- name, a waiter that registered no hand-off token).

-- The first member of the line whose place has not lapsed (lapsed ones are dropped on the
-- way, with their hand-off registration, hand_register.lua), or nil. `lined`: the caller saw
-- the line exist in this script (no second EXISTS). `holder`: a releasing waiter
-- (hand_grant.lua) whose own place, met on the way, is dropped and never taken for the head
-- (its registration the caller drops); it does not count among the 32 lapsed places.
local function live_head(key, line, lapse, lined, holder)
    -- Nobody waits (no line): nothing to find. Waiters always queue before they listen.
    if not lined and redis.call('EXISTS', line) == 0 then
        return nil
    end
    local time = redis.call('TIME')
    local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
    local dropped = 0
    while dropped < 32 do
        local first = redis.call('ZRANGE', line, 0, 0)
        if #first == 0 then
            return nil
        end
        if first[1] == holder then
            redis.call('ZREM', line, holder)
            redis.call('HDEL', lapse, holder)
        elseif tonumber(redis.call('HGET', lapse, first[1]) or '0') > now then
            return first[1], now
        else
            redis.call('ZREM', line, first[1])
            redis.call('HDEL', lapse, first[1])
            redis.call('HDEL', key .. '\0h', first[1])
            dropped = dropped + 1
        end
    end
    return nil
end

-- Publish `message` to the listener of the line member `member` (after an optional "r|"/"w|"
-- kind prefix: a reader or writer of the read-write lock of this name, wait_line.lua).
local function wake_member(key, member, message)
    local waiter = string.match(member, '^[rw]|(.*)$') or member
    local listener = string.match(waiter, '^([^.]+)%.')
    if listener ~= nil then
        redis.call('PUBLISH', key .. '\0w' .. listener, message or waiter)
    end
end

local function wake_next(key, line, lapse)
    local first = live_head(key, line, lapse)
    if first ~= nil then
        wake_member(key, first)
    end
end
