-- Does this node still hold a read or write lease of a read-write lock? Read-only.
--
-- KEYS[1]  the writer (the lock key, lock_key.lua)
-- KEYS[2]  the readers (key .. "\0r")
-- ARGV[1]  the mode: "r" or "w"
-- ARGV[2]  the lease token
--
-- Returns 1 when this token holds the lease here (a reader: its expiry is still ahead on the
-- node's clock), 0 otherwise (pcall: a key of another type under our name is not ours).
-- @include lock_key.lua
if ARGV[1] == 'w' then
    if lock_token(KEYS[1]) == ARGV[2] then
        return 1
    end
    return 0
end
local expiry = redis.pcall('ZSCORE', KEYS[2], ARGV[2])
if type(expiry) ~= 'string' then
    return 0
end
local time = redis.call('TIME')
if tonumber(expiry) > tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000) then
    return 1
end
return 0
