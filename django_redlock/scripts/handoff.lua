-- Hand a lease over to a new token on one node (``lease.handle()`` / ``m.adopt(handle)``).
--
-- KEYS[1]  the node's marker hash (node_rule.lua, vote_gate.lua)
-- KEYS[2…] the lease's keys: one lock key (a mutex, a write lease, a semaphore's slot), or
--          every key of a multi-lock; each a string as lock_key.lua lays it out
-- ARGV[1]  the old token (the handle's)
-- ARGV[2]  the new token (the adopter's, random from `secrets`)
-- ARGV[3]  the adopter's owner (lock_key.lua); never a token. '' keeps the owner: a failed
--          adopt hands the keys back to the handle's token (old and new swapped) this way
-- ARGV[4]  the restart quarantine in milliseconds (node_rule.lua)
-- ARGV[5]  the identity (node_identity.lua) of the server process this connection
--          reached ("" when not known yet)
-- ARGV[6]  the node's persistence as this connection read it (node_rule.lua)
--
-- Returns the ms left on the keys (the smallest PTTL) when every key now holds the new
-- token: each held the old one and was handed over, keeping its expiry (the adopter gets what
-- is left of the lease, never more), or already held the new one (a retry of the same
-- adoption). Returns -2 when refused (a key no longer holds the old token: expired, released,
-- or adopted by someone else); then nothing is written. QUARANTINED as acquire.lua: a node
-- that may have forgotten a newer holder's grant must not confirm an old token.
-- After a hand-off the old token's release, extend and owns are refused here, as for any
-- token that no longer holds the key: the first process's release is refused, never a double
-- release.
-- @include node_identity.lua
-- @include node_rule.lua
-- @include quarantine_longer.lua
-- @include vote_gate.lua
-- @include lock_key.lua
-- @include lock_write.lua
local refusal = vote_gate(KEYS[1], ARGV[4], ARGV[5], ARGV[6])
if refusal ~= nil then
    return redis.error_reply(refusal)
end
local old, new = ARGV[1], ARGV[2]
if old == new then
    return redis.error_reply('ERR the new token must differ from the old one')
end
local least, most = -1, -1
for i = 2, #KEYS do
    local held = lock_token(KEYS[i])
    if held ~= old and held ~= new then
        return -2
    end
    local left = redis.call('PTTL', KEYS[i])
    if left < 0 then
        return -2 -- not one of our leases: they always expire
    end
    if least < 0 or left < least then
        least = left
    end
    if left > most then
        most = left
    end
end
local tag = nil
if ARGV[3] ~= '' then
    local space = string.find(ARGV[3], ' ', 9, true)
    if space == nil then
        return redis.error_reply('ERR the owner argument must be "<owner id><acquired_at> <record>"')
    end
    tag = string.sub(ARGV[3], 1, space - 1)
    keep_owner(string.sub(tag, 1, 7), ARGV[3], most) -- before any key names it
end
for i = 2, #KEYS do
    -- KEEPTTL: the adopter inherits the time left, not a new lease.
    local rest = tag
    if rest == nil then
        -- Keep the owner: the tag after the token (owner id and acquired_at).
        local value = redis.call('GET', KEYS[i])
        rest = string.sub(value, string.find(value, ' ', 1, true) + 1)
    end
    redis.call('SET', KEYS[i], new .. ' ' .. rest, 'KEEPTTL')
end
return least
