-- Release a read or a write lease of a read-write lock on one node, or only leave the line;
-- then wake who may now take the lock.
--
-- KEYS[1]  the writer (the lock key, lock_key.lua; waiters hear wake-ups on channels named
--          after it)
-- KEYS[2]  the readers (key .. "\0r"), KEYS[3] their owners (key .. "\0o")
-- KEYS[4]  the wait line (key .. "\0q"), KEYS[5] the lapse times (key .. "\0e")
-- ARGV[1]  the mode: "r" or "w"
-- ARGV[2]  the lease token ("" to only leave the line: a blocking acquire that gave up)
-- ARGV[3]  the holder's waiter id ("" when it took the lease with a single try)
--
-- Returns 1 when this token held the lease here and no longer does, 0 otherwise (expired,
-- never granted here, or another holder's: another holder's grant is never touched).
-- Wakes (see readers.lua): the writer at the head of the line once no reader is left, or the
-- readers at the head up to the first writer once no writer holds it.
-- No `#!lua` shebang: deleting needs no memory, so a full node still lets a holder release.
-- @include wait_line.lua
-- @include readers.lua
-- @include lock_key.lua
local key, readers, owners, line, lapse = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local mode, token, waiter = ARGV[1], ARGV[2], ARGV[3]
if mode ~= 'r' and mode ~= 'w' then
    return redis.error_reply('ERR mode must be r or w, not ' .. mode)
end
local released = 0
if token ~= '' then
    if mode == 'w' then
        -- pcall: a key of another type under our name is not ours (release.lua).
        if lock_token(key) == token then
            redis.call('DEL', key)
            released = 1
        end
    elseif redis.call('ZSCORE', readers, token) then
        -- An expired reader is not released: it was lost (purged below if still there).
        if tonumber(redis.call('ZSCORE', readers, token)) > clock() then
            released = 1
        end
        redis.call('ZREM', readers, token)
        redis.call('HDEL', owners, token)
    end
end
local left = 0
if waiter ~= '' then
    left = leave_place(line, lapse, mode .. '|' .. waiter)
end
if released == 1 or left == 1 then
    wake_rw(key, line, lapse, purge_readers(readers, owners))
end
return released
