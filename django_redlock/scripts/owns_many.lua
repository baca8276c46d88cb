-- Does this node still hold every key of a multi-lock for this lease? Read-only (for
-- ``lease.owned()`` of ``lock_many``).
--
-- KEYS[…]  the lock keys of the multi-lock
-- ARGV[1]  the lease token
--
-- Returns 1 when every key holds this token, 0 otherwise (one absent, expired, another
-- holder's, or a key of another type: pcall, as owns.lua). A node that lost one key no
-- longer holds the lease, as extend_many.lua judges it.
-- @include lock_key.lua
for i = 1, #KEYS do
    if lock_token(KEYS[i]) ~= ARGV[1] then
        return 0
    end
end
return 1
