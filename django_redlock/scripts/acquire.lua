-- Take a Redlock lease on one node.
--
-- KEYS[1]  the lock key. The script names the other keys it uses after it, as every lock's are
--          named (the nodes are independent servers, never a Redis Cluster; the ACL patterns
--          that cover the lock key cover them):
--            the node's marker hash '\0django_redlock:node' (one per node, never expires, never
--            a user lock name): the identity of the process found fit to vote, and the longest
--            quarantine seen (node_rule.lua);
--            the lock's wait line KEYS[1] .. '\0q': a sorted set of waiter ids by ticket;
--            KEYS[1] .. '\0e': when each waiter's place in line lapses, ms on the node's clock;
--            the readers of the read-write lock of the same name, KEYS[1] .. '\0r'
--            (readers.lua): a lock is its read-write lock's write lease, so live readers hold
--            it back;
--            the gone mark of a waiter that takes hand-off grants, KEYS[1] .. '\0x' .. its
--            token (hand_gone.lua): its acquire is over here, so its tries are late, refused.
--          Why not passed as KEYS: each argument costs the node about as much as a redis.call
--          of the script (benchmarks/script_cost.py), and the common acquire needs only two of
--          the four names.
-- ARGV[1]  the lease token (random, from `secrets`)
-- ARGV[2]  the lease length in milliseconds (positive integer)
-- ARGV[3]  the owner: '<owner id><acquired_at> <record JSON: host, pid, thread, task, origin>'
--          (lock_key.lua, core/owner.py); never the token
-- ARGV[4]  the restart quarantine in milliseconds (the longest lease any client may hold)
-- ARGV[5]  the waiter id of a blocking acquire ("" for a single try, which never queues)
-- ARGV[6]  the waiter's ticket: the same number on every node (its first try, in µs)
-- ARGV[7]  how long a place in line lasts without a new try, in milliseconds
-- ARGV[8]  the round of a waiter that takes hand-off grants (1, 2, ...; "" or 0: none): its
--          token is then its hand-off token for every round (hand_register.lua)
-- ARGV[9]  the identity of the server process this connection reached (node_identity.lua:
--          '<run_id>/<master_replid2>:<second_repl_offset>'; "" when not known yet)
-- ARGV[10] the node's persistence as this connection read it (node_rule.lua: 'always', ...)
-- ARGV[11] only from a client with the node setting REPLICA_ACKS (appended by the transport,
--          wire/acks.py): its REPLICA_ACKS; ARGV[12] the replica count its WAIT asks for.
--          See replica_acks.lua. Absent (nil) for every other client.
--
-- Fair hand-off: a blocking acquire queues on every node under one ticket, so the line has
-- the same order everywhere, and a free lock goes to the head of the line (a try that jumps
-- the line is refused). A waiter that stops trying drops out when its place lapses.
-- Returns the status reply OK when the key now holds this token (newly taken, or already
-- ours from an earlier attempt of the same acquire, in which case its expiry is reset);
-- otherwise an integer: the holder's remaining milliseconds, or -1 when the key has no
-- expiry. A key of another type under our prefix (a user's, or a hash lock written by a
-- version before lock_key.lua's layout, during a rolling upgrade) counts as held by another
-- holder: its PTTL, never overwritten.
-- Returns the error QUARANTINED while the node may have forgotten locks it granted before a
-- restart (node_rule.lua): its vote does not count.
--
-- The lock is a string '<token> <owner id><acquired_at>' (lock_key.lua) with the owner record
-- in one key per owner: the token and the time travel with the key, expire with it, and are
-- deleted with it; the owner key outlives every lock naming it, then expires.
-- No `#!lua` shebang: plain EVAL semantics; this script writes, so a full node (OOM) refuses it,
-- which is the right answer for an acquire.
--
-- Cost (issue 25; benchmarks/script_cost.py measures it): the common acquire (the node known
-- fit, the quarantine the one it has seen, a free lock with no line and no readers) runs first,
-- in four redis.calls and no function of its own: HMGET of the marker, one EXISTS of the lock
-- key, its readers and its line, the SET, and the PTTL of the owner key. Every other case
-- falls through to the full rules below, exactly as they were; the fast path only skips what
-- it has proven would do nothing (quarantine_longer: equal texts; node_rule: the marker names
-- this process; HSET q: the stored q is the caller's; the hand-off prelude: no round, or round
-- 1 with no later round seen).
-- A waiter's first try that finds the lock held and queues (W3's steady state) takes 13
-- redis.calls: HMGET of the marker, HGET of its registration (the late-round check), EXISTS,
-- GET; wait_in_line's ZADD, TIME, HSET of the lapse time, PEXPIRE of the line and of the lapse
-- times; register_hand's HSET, PTTL and PEXPIRE of the registrations; the holder's PTTL. The
-- registration read once serves both the check and register_hand (hand_register.lua says
-- why that is safe): 14 before that cut (issue 25).
local key = KEYS[1]
local marker = redis.call('HMGET', '\0django_redlock:node', 'run', 'q', 'a')
local hand_checked = false
-- The waiter's hand-off registration as read in this script (HGET: a string, or false when
-- none); nil until read. register_hand (hand_register.lua) reuses it: see there.
local hand_seen = nil
local taken = nil -- the fast path's EXISTS count, when it ran (the slow path reuses it)
-- Not for a client that waits for replicas, nor on a node whose grants must be acknowledged
-- (marker field a): replica_acks.lua below decides those.
-- An identity that is empty (an EVAL sent in place of an EVALSHA after NOSCRIPT carries none)
-- never matches: node_rule.lua clears the marker's run to '' when a promoted replica is first
-- seen or a process is refused, and '' == '' passed a quarantined node through this path
-- (found by the simulator: seed 800431576, profile failovers, a SCRIPT FLUSH on a promoted
-- replica within its quarantine; a proxy that hides a failover from the connection does the
-- same).
local run = ARGV[9]
local known = run ~= nil and run ~= '' and marker[1] == run
if known and marker[2] == ARGV[4] and not marker[3] and ARGV[11] == nil then
    local round = ARGV[8]
    if round == '1' and ARGV[5] ~= '' then
        -- hand_register.lua's prelude for a waiter's first round: refused when a later round
        -- of the same waiter already ran here; a first round registers nothing more.
        hand_seen = redis.call('HGET', key .. '\0h', ARGV[5])
        if hand_seen and (tonumber(string.match(hand_seen, '^g?(%d+) ')) or 0) > 1 then
            return 0
        end
        hand_checked = true
        round = ''
    end
    if round == '' or round == '0' then
        if hand_checked and not hand_seen then
            -- The waiter's gone mark (hand_gone.lua) in the same call, counted 4 times (an
            -- argument costs far less than a call): 4 or more, and this try is late.
            local gone = key .. '\0x' .. ARGV[1]
            taken = redis.call('EXISTS', key, key .. '\0r', key .. '\0q', gone, gone, gone, gone)
            if taken >= 4 then
                return 0
            end
        else
            taken = redis.call('EXISTS', key, key .. '\0r', key .. '\0q')
        end
    end
    if taken == 0 then
        -- set_lock and keep_owner of lock_write.lua, inline (same writes, same order).
        local owner = ARGV[3]
        local space = string.find(owner, ' ', 9, true)
        if space ~= nil then
            local ttl = ARGV[2]
            redis.call('SET', key, ARGV[1] .. ' ' .. string.sub(owner, 1, space - 1), 'PX', ttl)
            local ms = tonumber(ttl)
            local owner_key = '\0o:' .. string.sub(owner, 1, 7) .. ':django_redlock:node'
            if redis.call('PTTL', owner_key) < ms then
                redis.call('SET', owner_key, string.sub(owner, space + 1), 'PX',
                    string.format('%d', 2 * ms))
            end
            return {ok = 'OK'}
        end
        -- A malformed owner argument: set_lock below raises the error.
    end
end

-- @include lock_key.lua
-- @include lock_write.lua
local now = 0
local function clock()
    if now == 0 then
        local time = redis.call('TIME')
        now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
    end
    return now
end

-- @include node_identity.lua
-- @include node_rule.lua
-- @include quarantine_longer.lua
-- @include replica_acks.lua
-- The marker names the process already found fit to vote, and the connection this command
-- came on named the process it talks to (its identity, read by the client when it connected):
-- equal strings, so no INFO call. A connection cannot outlive its server process, so a marker
-- restored from a snapshot never matches; then node_rule decides.
local quarantine = tonumber(ARGV[4])
local longer = quarantine_longer(marker[2], quarantine)
if longer ~= nil then
    return redis.error_reply(longer)
end
if not known then
    local refusal = node_rule('\0django_redlock:node', quarantine, ARGV[10], true)
    if refusal ~= nil then
        return redis.error_reply(refusal)
    end
elseif (tonumber(marker[2]) or 0) < quarantine then
    -- Remember the longest quarantine any client uses (see node_rule.lua).
    redis.call('HSET', '\0django_redlock:node', 'q', ARGV[4])
end
local unacknowledged = replica_acks('\0django_redlock:node', marker[3], ARGV[11], ARGV[12])
if unacknowledged ~= nil then
    return redis.error_reply(unacknowledged)
end

local waiter = ARGV[5]
local line, lapse, readers = key .. '\0q', key .. '\0e', key .. '\0r'
-- @include hand_register.lua

-- The first waiter in line whose place has not lapsed (lapsed ones are dropped on the way).
local function head()
    for _ = 1, 32 do
        local first = redis.call('ZRANGE', line, 0, 0)
        if #first == 0 then
            return nil
        end
        if tonumber(redis.call('HGET', lapse, first[1]) or '0') > clock() then
            return first[1]
        end
        redis.call('ZREM', line, first[1])
        redis.call('HDEL', lapse, first[1])
    end
    return nil
end

local function wait_in_line()
    if waiter == '' then
        return
    end
    local lifetime = tonumber(ARGV[7])
    redis.call('ZADD', line, 'NX', ARGV[6], waiter)
    redis.call('HSET', lapse, waiter, string.format('%d', clock() + lifetime))
    redis.call('PEXPIRE', line, lifetime)
    redis.call('PEXPIRE', lapse, lifetime)
    register_hand()
end

-- (The fast path's count stands: nothing was written since, whichever branch refused it.)
if (taken or redis.call('EXISTS', key, readers, line)) == 0 then
    -- No key, no readers, nobody in line. The lock is free and no waiter is ahead, whatever
    -- this acquire is (a single try or a waiter's try).
    set_lock(key, ARGV[1], ARGV[3], ARGV[2])
    return {ok = 'OK'}
end
local token = lock_token(key)
if type(token) == 'table' then
    -- A key of another type (an old-layout hash lock, a user's key): held, never overwritten.
    return redis.call('PTTL', key)
end
if token == false then
    -- Readers of the read-write lock of this name (rare: one EXISTS when there are none).
    -- Their expiry is their score, on this node's clock (readers.lua).
    if redis.call('EXISTS', readers) == 1 then
        local last = redis.call('ZRANGE', readers, -1, -1, 'WITHSCORES')
        if #last == 2 and tonumber(last[2]) > clock() then
            wait_in_line()
            return tonumber(last[2]) - clock()
        end
    end
    local first = head()
    if first ~= nil and first ~= waiter then
        wait_in_line()
        return 0 -- free, but another waiter is ahead in line
    end
    if first ~= nil then
        redis.call('ZREM', line, waiter)
        redis.call('HDEL', lapse, waiter)
    end
    set_lock(key, ARGV[1], ARGV[3], ARGV[2])
    return {ok = 'OK'}
end
if token == ARGV[1] then
    redis.call('PEXPIRE', key, ARGV[2])
    keep_owner_of(key, ARGV[3], tonumber(ARGV[2]))
    return {ok = 'OK'}
end
wait_in_line()
return redis.call('PTTL', key)
