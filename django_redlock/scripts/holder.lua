-- Read who holds a lock, for messages and operators (never the token).
--
-- KEYS[1]  the lock key
--
-- Returns {owner, pttl}: the owner metadata JSON stored by acquire.lua and the key's
-- remaining milliseconds; an empty array when the key is absent or holds no owner.
-- Read-only: a shebang would be allowed here, but plain EVAL keeps all scripts alike.
if redis.call('TYPE', KEYS[1]).ok ~= 'hash' then
    return {}
end
local owner = redis.call('HGET', KEYS[1], 'o')
if owner == false then
    return {}
end
return {owner, redis.call('PTTL', KEYS[1])}
