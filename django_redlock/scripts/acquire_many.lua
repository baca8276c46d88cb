-- Take several locks at once on one node: all of them or none.
--
-- KEYS[1]  the node's marker hash (node_rule.lua, vote_gate.lua)
-- KEYS[2…] per lock, four keys: the lock key, its wait line (key .. "\0q"), the lapse
--          times of its places (key .. "\0e") and the readers of the read-write lock of the
--          same name (key .. "\0r", readers.lua); the locks sorted by key, no key twice (the
--          client sorts them: every caller names the same keys in the same order)
-- ARGV[1]  the lease token (one token for all the keys: they are one lease)
-- ARGV[2]  the lease length in milliseconds (positive integer)
-- ARGV[3]  the owner (lock_key.lua); never the token
-- ARGV[4]  the restart quarantine in milliseconds (node_rule.lua)
-- ARGV[5]  the identity (node_identity.lua) of the server process this connection
--          reached ("" when not known yet)
-- ARGV[6]  the node's persistence as this connection read it (node_rule.lua)
--
-- Returns the status reply OK when every key now holds this token (each newly taken, or
-- already ours from an earlier attempt: expiries reset). Otherwise nothing is written and it
-- returns an integer: the ms until every key held by another here has run out (the longest
-- PTTL; -1 when one has no expiry), or 0 when the keys are free but a blocking acquire of one
-- of them waits in its line (a multi-lock never jumps a line; it never queues either).
-- A key of another type (an old-layout hash lock, a user's key) counts as held and is never
-- overwritten.
--
-- The keys are the very keys of single locks of the same names (acquire.lua), so a multi-lock
-- excludes the single locks of its names, and their holders see it on the admin page. Like
-- such a lock it is the write lease of the read-write lock of each name: live readers of any
-- of its names hold it back (and rw_acquire.lua refuses readers while it holds a key).
-- Deadlock-free: each try takes all or nothing in one atomic step per node, and a client
-- holds nothing while it waits; a failed try is released on every node before the next.
-- Safety on a quorum is the mutex's, key by key: every key of a valid multi-lease was set on
-- a quorum within the validity, so no other valid lease on any of its names exists.
-- @include node_identity.lua
-- @include node_rule.lua
-- @include quarantine_longer.lua
-- @include vote_gate.lua
-- @include wait_line.lua
-- @include lock_key.lua
-- @include lock_write.lua
local refusal = vote_gate(KEYS[1], ARGV[4], ARGV[5], ARGV[6])
if refusal ~= nil then
    return redis.error_reply(refusal)
end
local token, ttl = ARGV[1], ARGV[2]
local longest = 0
local held_by_others = false
local behind_line = false
local function hold_back(left)
    held_by_others = true
    if left < 0 or longest < 0 then
        longest = -1
    elseif left > longest then
        longest = left
    end
end
for i = 2, #KEYS, 4 do
    local key = KEYS[i]
    local held = lock_token(key)
    if held ~= token then
        if held == false then
            -- Readers of this name: their expiry is their score, on this node's clock
            -- (readers.lua); the last one to run out is what we would wait for.
            local last = redis.call('ZRANGE', KEYS[i + 3], -1, -1, 'WITHSCORES')
            if #last == 2 and tonumber(last[2]) > clock() then
                hold_back(tonumber(last[2]) - clock())
            elseif #live_places(KEYS[i + 1], KEYS[i + 2], 1) > 0 then
                behind_line = true
            end
        else
            hold_back(redis.call('PTTL', key))
        end
    end
end
if held_by_others then
    return longest
end
if behind_line then
    return 0
end
for i = 2, #KEYS, 4 do
    set_lock(KEYS[i], token, ARGV[3], ttl)
end
return {ok = 'OK'}
