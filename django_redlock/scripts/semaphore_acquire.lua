-- Take one slot of a semaphore on one node.
--
-- KEYS[1]  the node's marker hash (node_rule.lua, vote_gate.lua)
-- KEYS[2]  the semaphore's wait line: sorted set of waiter ids by ticket (<base> .. "\0q")
-- KEYS[3]  when each place in line lapses, ms on the node's clock (<base> .. "\0e")
-- KEYS[4…] the slots, in order: slot i is the key <base> .. i (i = 0 … limit - 1), where
--          <base> is the lock key .. "\0s"; each slot is a string like a lock's
--          (lock_key.lua), so limit = #KEYS - 3
-- ARGV[1]  the lease token (random, from `secrets`)
-- ARGV[2]  the lease length in milliseconds (positive integer)
-- ARGV[3]  the owner (lock_key.lua); never the token
-- ARGV[4]  the restart quarantine in milliseconds (node_rule.lua)
-- ARGV[5]  the waiter id of a blocking acquire ("" for a single try, which never queues)
-- ARGV[6]  the waiter's ticket: the same number on every node (its first try, in µs)
-- ARGV[7]  how long a place in line lasts without a new try, in milliseconds
-- ARGV[8]  the slot to prefer when it is free (-1: none): on a retry, the slot most nodes
--          answered last time, so nodes whose states differ converge on one slot
-- ARGV[9]  the identity (node_identity.lua) of the server process this connection
--          reached ("" when not known yet)
-- ARGV[10] the node's persistence as this connection read it (node_rule.lua)
--
-- Returns {1, slot} when this token now holds that slot here: the slot it already held (a
-- retry of the same acquire; its expiry is reset), else the preferred slot if free, else the
-- lowest free slot. Nodes in the same state answer the same slot.
-- Returns {0, ms} when refused: ms until the first held slot here runs out (-1 when no held
-- slot has an expiry), or 0 when a slot is free but waiters ahead in line take every free one.
-- Returns the error QUARANTINED while the node may have forgotten grants (node_rule.lua).
--
-- Why this is safe on a quorum (the argument the client relies on): a per-node counter capped
-- at `limit` is NOT safe with quorums (N = 3, limit = 3: four clients can each hold 2 of the 3
-- nodes within the 9 per-node places). Here each slot is a Redlock mutex of its own: the
-- client is granted slot s only when a quorum of nodes answered s within the validity (same
-- drift rule as acquire.lua's lock), and frees the grants of the nodes that answered another
-- slot. Two valid leases on slot s would need two quorums, which share a node whose key
-- <base> .. s held both tokens at once, and this script sets a slot only when it is free. So at
-- most one valid lease per slot, at most `limit` valid leases in all, whatever the nodes'
-- states. A token takes at most one slot per node, so a retry never takes a second one.
--
-- Fair FIFO waiting: blocking acquires queue under one ticket, so the line has the same order
-- everywhere; with F slots free, only the first F live places in line may take one (a try
-- that would jump the line is refused, and queues). A slot key of another type under our name,
-- or an old-layout hash lock, counts as held and is never overwritten.
-- @include node_identity.lua
-- @include node_rule.lua
-- @include quarantine_longer.lua
-- @include vote_gate.lua
-- @include wait_line.lua
-- @include lock_key.lua
-- @include lock_write.lua
local refusal = vote_gate(KEYS[1], ARGV[4], ARGV[9], ARGV[10])
if refusal ~= nil then
    return redis.error_reply(refusal)
end

local token, ttl, waiter = ARGV[1], ARGV[2], ARGV[5]
local line, lapse = KEYS[2], KEYS[3]
local limit = #KEYS - 3
local free = {}
local is_free = {}
local soonest = -1
for i = 0, limit - 1 do
    local slot = KEYS[4 + i]
    local held = lock_token(slot)
    if held == token then
        redis.call('PEXPIRE', slot, ttl)
        keep_owner_of(slot, ARGV[3], tonumber(ttl))
        if waiter ~= '' then
            leave_place(line, lapse, waiter)
        end
        return {1, i}
    end
    if held == false then
        free[#free + 1] = i
        is_free[i] = true
    else
        local left = redis.call('PTTL', slot)
        if left >= 0 and (soonest < 0 or left < soonest) then
            soonest = left
        end
    end
end

local function queue()
    if waiter ~= '' then
        take_place(line, lapse, waiter, ARGV[6], tonumber(ARGV[7]))
    end
end

if #free == 0 then
    queue()
    return {0, soonest}
end
-- With F slots free, the first F live places in line go first: count those ahead of us.
local ahead = 0
for _, member in ipairs(live_places(line, lapse, #free + 1)) do
    if member == waiter then
        break
    end
    ahead = ahead + 1
end
if ahead >= #free then
    queue()
    return {0, 0}
end
local chosen = free[1]
local prefer = tonumber(ARGV[8])
if prefer ~= nil and is_free[prefer] then
    chosen = prefer
end
if waiter ~= '' then
    leave_place(line, lapse, waiter)
end
local slot = KEYS[4 + chosen]
set_lock(slot, token, ARGV[3], ttl)
return {1, chosen}
