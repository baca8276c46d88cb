-- Take a read or a write lease of a read-write lock on one node.
--
-- KEYS[1]  the writer: a string like a lock's (lock_key.lua), the lock key itself
-- KEYS[2]  the readers: sorted set token -> expiry in ms on the node's clock (key .. "\0r")
-- KEYS[3]  the readers' owners: hash token -> owner JSON (key .. "\0o")
-- KEYS[4]  the wait line: sorted set of "r|<waiter id>" / "w|<waiter id>" by ticket
--          (key .. "\0q")
-- KEYS[5]  when each place in line lapses, ms on the node's clock (key .. "\0e")
-- KEYS[6]  the node's marker hash (node_rule.lua, vote_gate.lua)
-- ARGV[1]  the mode: "r" (shared) or "w" (exclusive)
-- ARGV[2]  the lease token (random, from `secrets`)
-- ARGV[3]  the lease length in milliseconds (positive integer)
-- ARGV[4]  the owner (lock_key.lua); a reader's whole record goes in KEYS[3]; never the token
-- ARGV[5]  the restart quarantine in milliseconds (node_rule.lua)
-- ARGV[6]  the waiter id of a blocking acquire ("" for a single try, which never queues)
-- ARGV[7]  the waiter's ticket: the same number on every node (its first try, in µs)
-- ARGV[8]  how long a place in line lasts without a new try, in milliseconds
-- ARGV[9]  the identity (node_identity.lua) of the server process this connection
--          reached ("" when not known yet)
-- ARGV[10] the node's persistence as this connection read it (node_rule.lua)
--
-- Returns the status reply OK when this token now holds the lease here (newly, or already
-- from an earlier attempt of the same acquire: its expiry is reset). Otherwise an integer:
-- the ms until what blocks it here runs out (the writer's PTTL, -1 when that key has no
-- expiry; for a writer blocked by readers, the last reader's time left), or 0 when only
-- waiters ahead in line block it. QUARANTINED as acquire.lua.
--
-- The rules, per node:
--   * a reader is granted when no writer holds the lock and no live writer (or waiter of
--     the lock of the same name) waits ahead of it in line (a single try: none in line);
--   * a writer is granted when no writer holds it, no reader is live, and it heads the line
--     (a single try: the line is empty).
-- A refused blocking try keeps its place in line (one ticket on every node, so one order
-- everywhere); a writer's place is its intent: it holds back every reader that comes after
-- it, so readers cannot starve a writer, and a writer cannot overtake readers that queued
-- before it. A place lapses when its waiter stops trying (ARGV[8]).
--
-- Why this is safe on a quorum: on one node this script never lets a writer key and a live
-- reader coexist (a write is granted only with no live reader, a read only with no writer),
-- and a reader lives until its expiry on the node's clock as a lock key does. A valid write
-- lease needs a quorum W of grants, a valid read lease a quorum R (same validity rule as
-- acquire.lua); W and R share a node, which held both grants at once for no instant of the
-- two leases' validity. Two writers are excluded as two holders of a lock are.
-- @include node_identity.lua
-- @include node_rule.lua
-- @include quarantine_longer.lua
-- @include vote_gate.lua
-- @include wait_line.lua
-- @include readers.lua
-- @include lock_key.lua
-- @include lock_write.lua
local refusal = vote_gate(KEYS[6], ARGV[5], ARGV[9], ARGV[10])
if refusal ~= nil then
    return redis.error_reply(refusal)
end

local key, readers, owners, line, lapse = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local mode, token, ttl, waiter = ARGV[1], ARGV[2], ARGV[3], ARGV[6]
if mode ~= 'r' and mode ~= 'w' then
    return redis.error_reply('ERR mode must be r or w, not ' .. mode)
end
local member = ''
if waiter ~= '' then
    member = mode .. '|' .. waiter
end

local function queue()
    if member ~= '' then
        take_place(line, lapse, member, ARGV[7], tonumber(ARGV[8]))
    end
end

local function granted()
    if member ~= '' then
        leave_place(line, lapse, member)
    end
    return {ok = 'OK'}
end

local live = purge_readers(readers, owners)
if mode == 'r' then
    if redis.call('ZSCORE', readers, token) then
        redis.call('ZADD', readers, 'XX', string.format('%d', clock() + tonumber(ttl)), token)
        keep_readers(readers, owners, ttl)
        return granted()
    end
    if redis.call('EXISTS', key) == 1 then
        queue()
        return redis.call('PTTL', key)
    end
    -- A live writer waiting ahead of us holds us back (conservative past 128 places).
    local places = live_places(line, lapse, 128)
    local found = false
    for _, place in ipairs(places) do
        if place == member then
            found = true
            break
        end
        -- A writer, or a lock's waiter (a lock is this lock's write lease): not 'r|'.
        if string.sub(place, 1, 2) ~= 'r|' then
            queue()
            return 0
        end
    end
    if not found and #places >= 128 then
        queue()
        return 0
    end
    local record = owner_json(ARGV[4]) -- raises on a malformed owner: before any write
    redis.call('ZADD', readers, string.format('%d', clock() + tonumber(ttl)), token)
    redis.call('HSET', owners, token, record)
    keep_readers(readers, owners, ttl)
    return granted()
end

local held = lock_token(key)
if held == token then
    redis.call('PEXPIRE', key, ttl)
    keep_owner_of(key, ARGV[4], tonumber(ttl))
    return granted()
end
if held then
    -- Another writer, or a key that is not a lock of ours (an old-layout hash): held.
    queue()
    return redis.call('PTTL', key)
end
if live > 0 then
    queue()
    local last = redis.call('ZRANGE', readers, -1, -1, 'WITHSCORES')
    return math.max(1, tonumber(last[2]) - clock())
end
local first = live_places(line, lapse, 1)[1]
if first ~= nil and first ~= member then
    queue()
    return 0
end
set_lock(key, token, ARGV[4], ttl)
return granted()
