-- Included by the semaphore and read-write lock scripts: their wait lines, shaped like a
-- mutex's (acquire.lua): a sorted set of waiter ids by ticket (the same number on every node:
-- the waiter's first try, in µs) and a hash of when each place lapses (ms on the node's clock).
-- A place lapses when its waiter stops trying; lapsed places are dropped wherever they are met.
--
-- A waiter id is "<listener>.<nonce>" (wake_next.lua); the waiter hears its wake-up on the
-- channel <base> .. "\0w" .. <listener>, <base> being the primitive's base key.

local now_ms = 0
local function clock()
    if now_ms == 0 then
        local time = redis.call('TIME')
        now_ms = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
    end
    return now_ms
end

-- The first live places of the line, at most `count` of them, in ticket order: lapsed places
-- met on the way are dropped. Each entry is the member as stored.
local function live_places(line, lapse, count)
    local found = {}
    if count <= 0 then
        return found
    end
    local start = 0
    for _ = 1, 8 do
        local members = redis.call('ZRANGE', line, start, start + count + 31)
        if #members == 0 then
            return found
        end
        for _, member in ipairs(members) do
            if tonumber(redis.call('HGET', lapse, member) or '0') > clock() then
                found[#found + 1] = member
                if #found >= count then
                    return found
                end
                start = start + 1
            else
                redis.call('ZREM', line, member)
                redis.call('HDEL', lapse, member)
            end
        end
    end
    return found
end

-- Queue `member` under `ticket` (kept if already queued: the first ticket counts) and renew
-- its place for `lifetime` ms.
local function take_place(line, lapse, member, ticket, lifetime)
    redis.call('ZADD', line, 'NX', ticket, member)
    redis.call('HSET', lapse, member, string.format('%d', clock() + lifetime))
    redis.call('PEXPIRE', line, lifetime)
    redis.call('PEXPIRE', lapse, lifetime)
end

local function leave_place(line, lapse, member)
    redis.call('HDEL', lapse, member)
    return redis.call('ZREM', line, member)
end

-- Wake the waiter of `member` (its id, after an optional "r|"/"w|" kind prefix) on its
-- listener's channel; the message is the waiter id, as wake_next.lua sends it.
local function wake(base, member)
    local waiter = string.match(member, '^[rw]|(.*)$') or member
    local listener = string.match(waiter, '^([^.]+)%.')
    if listener ~= nil then
        redis.call('PUBLISH', base .. '\0w' .. listener, waiter)
    end
end
