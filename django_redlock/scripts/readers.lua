-- Included by the read-write lock scripts (needs wait_line.lua first, for clock() and the
-- line): the readers of one lock on one node, and who to wake when the lock may be taken.
--
-- Readers are a sorted set (<key> .. "\0r": token -> expiry, ms on the node's clock) beside a
-- hash of their owners (<key> .. "\0o": token -> owner JSON). Both keys expire with the last
-- reader, so nothing leaks. Expired readers are purged on every call that looks at them: a
-- reader's expiry plays the part of a lock key's PEXPIRE, on the same clock.

-- Drop readers whose time ran out; returns how many readers are still live.
local function purge_readers(readers, owners)
    for _ = 1, 16 do
        local gone = redis.call('ZRANGEBYSCORE', readers, '-inf', clock(), 'LIMIT', 0, 64)
        if #gone == 0 then
            break
        end
        redis.call('ZREM', readers, unpack(gone))
        redis.call('HDEL', owners, unpack(gone))
    end
    return redis.call('ZCARD', readers)
end

-- Both reader keys live at least `ttl` ms more (a reader's own expiry is its score).
local function keep_readers(readers, owners, ttl)
    local left = redis.call('PTTL', readers)
    if left < tonumber(ttl) then
        redis.call('PEXPIRE', readers, ttl)
        redis.call('PEXPIRE', owners, ttl)
    end
end

-- Wake who may now take the lock: nobody while a writer holds it; else the head of the line
-- if it is a writer and no reader is left, or every reader from the head up to the first
-- writer (at most 64; the rest poll).
local function wake_rw(key, line, lapse, live_readers)
    if redis.call('EXISTS', key) == 1 or redis.call('EXISTS', line) == 0 then
        return
    end
    local places = live_places(line, lapse, 64)
    for index, member in ipairs(places) do
        if string.sub(member, 1, 2) ~= 'r|' then -- a writer, or a waiter of the lock
            if index == 1 and live_readers == 0 then
                wake(key, member)
            end
            return
        end
        wake(key, member)
    end
end

-- The owner argument ('<tag> <record>', lock_key.lua) as one JSON record: what a reader's
-- entry in the owners' hash keeps. Raises on a malformed one, before anything is written.
local function owner_json(owner)
    local space = string.find(owner, ' ', 9, true)
    if space == nil then
        error({err = 'ERR the owner argument must be "<owner id><acquired_at> <record>"'})
    end
    local ms = tonumber(string.sub(owner, 8, space - 1), 36) or 0
    return string.sub(owner, space + 1) .. string.format('%.3f', ms / 1000) .. '}'
end
