-- Read who holds a lock, for messages and operators (never the token).
--
-- KEYS[1]  the lock key
--
-- Returns {owner, pttl}: the owner record JSON (host, pid, thread, task, origin, acquired_at;
-- lock_key.lua rebuilds it from the key and its owner key) and the key's remaining
-- milliseconds; an empty array when the key is absent or is not a lock.
-- Read-only: a shebang would be allowed here, but plain EVAL keeps all scripts alike.
-- @include lock_key.lua
-- @include lock_owner.lua
local owner = owner_of(KEYS[1], nil)
if owner == false then
    return {}
end
return {owner, redis.call('PTTL', KEYS[1])}
