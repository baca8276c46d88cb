-- Extend a read or a write lease of a read-write lock on one node.
--
-- KEYS[1]  the writer hash (the lock key)
-- KEYS[2]  the readers (key .. "\0r"), KEYS[3] their owners (key .. "\0o")
-- ARGV[1]  the kind: "r" or "w"
-- ARGV[2]  the lease token
-- ARGV[3]  the new lease length in milliseconds (positive integer), counted from now
--
-- Returns 1 when this token held the lease here and its expiry was reset, 0 otherwise. An
-- expired or absent grant is never re-created (lease continuity, as extend.lua): a reader
-- past its expiry is purged, not renewed.
-- @include wait_line.lua
-- @include readers.lua
local key, readers, owners = KEYS[1], KEYS[2], KEYS[3]
local kind, token, ttl = ARGV[1], ARGV[2], ARGV[3]
if kind == 'w' then
    if redis.pcall('HGET', key, 't') == token then
        redis.call('PEXPIRE', key, ttl)
        return 1
    end
    return 0
end
if kind ~= 'r' then
    return redis.error_reply('ERR kind must be r or w, not ' .. kind)
end
purge_readers(readers, owners)
if not redis.call('ZSCORE', readers, token) then
    return 0
end
redis.call('ZADD', readers, 'XX', string.format('%d', clock() + tonumber(ttl)), token)
keep_readers(readers, owners, ttl)
return 1
