-- Does this node still hold the lock for this lease? Read-only (for ``lease.owned()``).
--
-- KEYS[1]  the lock key
-- ARGV[1]  the lease token
--
-- Returns 1 when the key holds this token, 0 otherwise (absent, expired, another holder's, or a
-- key of another type: pcall, so a user's SET under our name reads as "not ours").
-- @include lock_key.lua
if lock_token(KEYS[1]) == ARGV[1] then
    return 1
end
return 0
