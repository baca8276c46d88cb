-- Renew a multi-lock on one node: all of its keys or none, re-creating keys this node lost.
--
-- KEYS[…]  per lock, two keys: the lock key and the readers of the read-write lock of the same
--          name (key .. "\0r"), the locks sorted by key (primitives.many_keys)
-- ARGV[1]  the lease token
-- ARGV[2]  the new lease length in milliseconds (positive integer), counted from now
-- ARGV[3]  the owner (lock_key.lua), stored in keys that are re-created; never the token
--
-- Returns 1 when every key held this token and all expiries were reset; 2 when some were
-- absent and are now re-created (the rest renewed); -1 when another holder has one of the
-- names here (another token, a key of another type, live readers where our key is gone), and
-- then nothing is written. Re-creation follows acquire_many.lua's rules without the lines or
-- the quarantine (extend.lua says why that is needed and safe).
-- @include lock_key.lua
-- @include lock_write.lua
local token, ttl = ARGV[1], ARGV[2]
local now = nil
local missing = false
for i = 1, #KEYS, 2 do
    local key, readers = KEYS[i], KEYS[i + 1]
    local held = lock_token(key)
    if held ~= token then
        if held then
            return -1
        end
        if redis.call('EXISTS', readers) == 1 then
            if now == nil then
                local time = redis.call('TIME')
                now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
            end
            local last = redis.call('ZRANGE', readers, -1, -1, 'WITHSCORES')
            if #last == 2 and tonumber(last[2]) > now then
                return -1
            end
        end
        missing = true
    end
end
for i = 1, #KEYS, 2 do
    local key = KEYS[i]
    if redis.call('EXISTS', key) == 0 then
        set_lock(key, token, ARGV[3], ttl)
    else
        redis.call('PEXPIRE', key, ttl)
        keep_owner_of(key, ARGV[3], tonumber(ttl))
    end
end
if missing then
    return 2
end
return 1
