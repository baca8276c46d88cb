-- Release a Redlock lease on one node: compare-and-delete, then hand the lock to the next
-- waiter (hand_grant.lua) or wake it.
--
-- KEYS[1]  the lock key (waiters listen on channels named after it: see wake_next.lua). The
--          script names the lock's other keys after it, as acquire.lua does (each argument
--          costs the node about what a redis.call does): its wait line KEYS[1] .. '\0q'
--          (sorted set of waiter ids by ticket), the lapse times of the places in line
--          KEYS[1] .. '\0e' (hash, ms on the node's clock), the hand-off registrations
--          KEYS[1] .. '\0h' (hand_register.lua).
-- ARGV[1]  the lease token
-- ARGV[2]  the holder's waiter id ("" when it took the lock with a single try)
-- ARGV[3]  optional: the identity (node_identity.lua) of the server process this connection
--          reached ("" or absent: not known), then ARGV[4] its persistence (unused): the
--          identity the transport appends to a command posted with identify=True
--          (release_command(identified=True)).
--          With it a hand-off grant needs no INFO call (hand_grant.lua).
--
-- Returns 1 when the key held this token and was deleted (or written over by a grant to the
-- next waiter, hand_grant.lua), 0 otherwise (absent, expired, or held by another token:
-- another holder's key is never deleted).
-- A release grants the lock here to the first waiter in line when that waiter registered a
-- hand-off token (hand_grant.lua: the safety argument), else wakes only that waiter
-- (wake_next.lua): it retries at once, the others keep waiting, so a release costs at most
-- one retry and one wake-up, not one per waiter.
-- A waiter's release (ARGV[2] not "") also leaves the waiter's gone mark here, in every case:
-- a try of its acquire that this node has not run yet is then refused when it runs late,
-- instead of queueing a phantom at the head of the line (hand_gone.lua: why, and how long).
-- No `#!lua` shebang on purpose: DEL needs no memory, so a node that is full (maxmemory with
-- noeviction) still lets a holder release; a shebang script without allow-oom would be refused.
-- Cost (issue 25; benchmarks/script_cost.py): the common release runs first, in three
-- redis.calls and no function of its own: GET, DEL and one EXISTS that finds no line (so
-- nothing to clean up or hand over; a waiter's release runs it before the DEL, and also
-- learns there whether a hand-off registration of its own may remain, and whether the
-- readers key exists). Every other case falls through to the full rules below.
-- A waiter's release with no line runs GET, EXISTS, DEL (and HDEL when a registration may
-- remain), then the SET of its gone mark (issue 40, item 10).
-- A waiter's release that grants the lock to the next waiter (W3's steady state: the holder
-- was granted the lock, so its place is gone) takes 15 redis.calls: GET, EXISTS, HDEL of
-- its registration; live_head's TIME, ZRANGE and HGET of the head's lapse time;
-- hand_grant.lua's HGET of the head's registration and of the marker, the SET that writes the
-- grant over the released key (no DEL first), the owner key's PTTL, one ZREM and one HDEL for
-- the places and lapse times of the head and of the releaser, HSET of the 'g' mark, PUBLISH
-- (no look at the readers: none); then the SET of its gone mark. It took 18 before the cuts
-- of issue 25, each argued where it is made (here and in hand_grant.lua, wake_next.lua), 14
-- after them, before the gone mark.
-- @include hand_gone.lua
local key = KEYS[1]
local line = key .. '\0q'
local released, lined, no_readers = false, false, false
local value = redis.pcall('GET', key)
if type(value) == 'string' then
    -- lock_key.lua's lock_token, inline: the token is what precedes the first space.
    local space = string.find(value, ' ', 1, true)
    if space ~= nil and string.sub(value, 1, space - 1) == ARGV[1] then
        if ARGV[2] == '' then
            redis.call('DEL', key)
            if redis.call('EXISTS', line) == 0 then
                return 1
            end
        else
            -- Weighted, in one call (an EXISTS argument costs the node far less than a
            -- redis.call): the line named twice, the hand-off registrations once, the
            -- readers of the read-write lock of this name twice: 2*line + h + 2*readers.
            local hand, readers = key .. '\0h', key .. '\0r'
            local found = redis.call('EXISTS', line, line, hand, readers, readers)
            if found < 2 then
                -- No line: no place of ours in it, no lapse time either (both are written
                -- and dropped together), nobody to hand over to; only a registration of
                -- ours may remain (a granted waiter's 'g' entry): found is 1.
                redis.call('DEL', key)
                if found == 1 then
                    redis.call('HDEL', hand, ARGV[2])
                end
                -- Its gone mark, after the DEL (hand_gone.lua).
                pcall(redis.call, 'SET', key .. '\0x' .. ARGV[1], '1', 'PX', GONE_MS)
                return 1
            end
            -- Below 4, no readers key (without a line, found is at most 3: 2 and 3 are also
            -- readers without a line, rare, which the full rules below handle: live_head
            -- finds no head in an absent line, so nothing is granted and no reader looked
            -- at). Then hand_grant.lua's look at the last reader would find nothing (nothing
            -- in this script writes the readers key), so it is skipped.
            no_readers = found < 4
            -- A line: the key, still ours, is deleted by grant_next unless it grants the
            -- lock, whose SET then writes the next holder's token over ours: the same as DEL
            -- then SET in one script (no other command runs in between), one DEL less per
            -- hand-off (hand_grant.lua: `holder`). A full node (maxmemory, noeviction)
            -- grants as before: the HDEL of the holder's registration below, a write that
            -- needs no memory, comes first, as the DEL did, so the SET is never the script's
            -- first write (which a full node refuses). A single try's release keeps its DEL.
        end
        released, lined = true, true -- grant_next need not look for the line again
    end
end
-- @include wake_next.lua
-- @include lock_key.lua
-- @include lock_write.lua
-- @include node_identity.lua
-- @include hand_grant.lua
local lapse = key .. '\0e'
-- A key of another type under our name (a user's key, an old-layout hash lock) is not ours
-- (lock_key.lua): answer 0 (not held), never a WRONGTYPE error that would hide the loss.
if not released then
    -- Not held here by this lease (expired, or another attempt won this node): still drop
    -- the holder's place in line. If that place headed the line of a free lock, the next
    -- waiter was refused behind it and no other release will come: wake it.
    -- Its registration goes with its place, or alone (a try that registered without
    -- queueing). A try of the waiter that has not run here yet is late: its gone mark
    -- refuses it (hand_gone.lua), after these writes that need no memory.
    if ARGV[2] ~= '' then
        redis.call('HDEL', key .. '\0h', ARGV[2])
        if redis.call('ZREM', line, ARGV[2]) == 1 then
            redis.call('HDEL', lapse, ARGV[2])
            if redis.call('EXISTS', key) == 0 then
                grant_next(key, line, lapse, false, ARGV[3])
            end
        end
        pcall(redis.call, 'SET', key .. '\0x' .. ARGV[1], '1', 'PX', GONE_MS)
    end
    return 0
end
-- A waiter's release drops its registration (a granted waiter's 'g' entry) and its own place
-- in line, which may remain on nodes that did not grant it the lock (they queued it, then the
-- others gave it a quorum): hand_grant.lua (`holder`) never takes that place for the head,
-- and drops it with the head's when it grants (one ZREM and one HDEL for both), else alone,
-- its lapse time only when ZREM found it (see there why that is enough).
-- In a pcall: the key, still ours until grant_next writes over it or deletes it, is freed
-- whatever fails on the way (a foreign key of another type under one of the lock's names, an
-- ACL without +info), as the DEL that came first did: a script is not rolled back, and an
-- error must not leave the released lock held for its ttl. Nothing that can fail runs after
-- a grant's SET (every other key was read with a typed command before it), so the DEL below
-- never deletes a grant; the lock_token check makes sure of it.
if ARGV[2] ~= '' then
    local ok, failure = pcall(function()
        redis.call('HDEL', key .. '\0h', ARGV[2])
        grant_next(key, line, lapse, lined, ARGV[3], no_readers, ARGV[2])
    end)
    -- The waiter's tries yet to run here are late: its gone mark (hand_gone.lua).
    pcall(redis.call, 'SET', key .. '\0x' .. ARGV[1], '1', 'PX', GONE_MS)
    if not ok then
        if lock_token(key) == ARGV[1] then
            redis.call('DEL', key)
        end
        error(failure)
    end
else
    grant_next(key, line, lapse, lined, ARGV[3], no_readers)
end
return 1
