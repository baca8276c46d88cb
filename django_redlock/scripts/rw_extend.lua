-- Renew a read or a write lease of a read-write lock on one node, or re-create it where this
-- node lost it.
--
-- KEYS[1]  the writer (the lock key, lock_key.lua)
-- KEYS[2]  the readers (key .. "\0r"), KEYS[3] their owners (key .. "\0o")
-- ARGV[1]  the mode: "r" or "w"
-- ARGV[2]  the lease token
-- ARGV[3]  the new lease length in milliseconds (positive integer), counted from now
-- ARGV[4]  the owner (lock_key.lua), stored when the grant is re-created; never the token
--
-- Returns 1 when this token held the lease here and its expiry was reset; 2 when the grant
-- was absent and is now re-created (a reader past its expiry is purged first, then re-created
-- like any absent grant); -1 when another holder has taken its place here (another writer's
-- token; for a write lease, live readers where its key is gone; for a read lease, a writer),
-- and then nothing is written. Re-creation follows the grant rules of rw_acquire.lua (a read
-- beside no writer, a write beside no writer and no live reader) without the line or the
-- quarantine; extend.lua says why that is needed and safe.
-- @include wait_line.lua
-- @include readers.lua
-- @include lock_key.lua
-- @include lock_write.lua
local key, readers, owners = KEYS[1], KEYS[2], KEYS[3]
local mode, token, ttl = ARGV[1], ARGV[2], ARGV[3]
if mode ~= 'r' and mode ~= 'w' then
    return redis.error_reply('ERR mode must be r or w, not ' .. mode)
end
local writer = lock_token(key)
if mode == 'w' then
    if writer == token then
        redis.call('PEXPIRE', key, ttl)
        keep_owner_of(key, ARGV[4], tonumber(ttl))
        return 1
    end
    if writer then
        return -1
    end
    if purge_readers(readers, owners) > 0 then
        return -1
    end
    set_lock(key, token, ARGV[4], ttl)
    return 2
end
purge_readers(readers, owners)
local renewed = 1
if not redis.call('ZSCORE', readers, token) then
    if writer then
        return -1
    end
    redis.call('HSET', owners, token, owner_json(ARGV[4]))
    renewed = 2
end
redis.call('ZADD', readers, string.format('%d', clock() + tonumber(ttl)), token)
keep_readers(readers, owners, ttl)
return renewed
