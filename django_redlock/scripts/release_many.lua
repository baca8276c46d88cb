-- Release a multi-lock on one node: compare-and-delete each of its keys, then wake the next
-- waiter of each lock freed (wake_next.lua, as release.lua).
--
-- KEYS[…]  per lock, three keys: the lock key, its wait line (key .. "\0q") and the lapse
--          times of its places (key .. "\0e")
-- ARGV[1]  the lease token
--
-- Returns how many keys held this token and were deleted (0 … #KEYS / 3); another holder's
-- key is never deleted. The client counts a node as released when it deleted them all.
-- No `#!lua` shebang: DEL needs no memory, so a full node still lets a holder release.
-- @include wake_next.lua
-- @include lock_key.lua
local deleted = 0
for i = 1, #KEYS, 3 do
    -- pcall: a key of another type under our name is not ours (release.lua).
    if lock_token(KEYS[i]) == ARGV[1] then
        redis.call('DEL', KEYS[i])
        deleted = deleted + 1
        wake_next(KEYS[i], KEYS[i + 1], KEYS[i + 2])
    end
end
return deleted
