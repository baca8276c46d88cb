-- Included by release.lua after wake_next.lua, lock_key.lua and lock_write.lua: give a lock
-- that just became free on this node to the live head of its line outright, instead of
-- waking it for a try of its own (one round trip to N nodes less per hand-off).
--
-- The grant writes the lock key as the head's own try would (set_lock: '<H> <owner tag>',
-- PX its ttl), removes the head from the line, and publishes "<waiter id> <round>" on its
-- channel (hand_register.lua). The head holds once a quorum of nodes granted H.
--
-- Why no two holders overlap within their validity:
--   * A node grants only a key that is free here: after the compare-and-delete of the
--     releaser's own token (a waiter's release compares, then the grant's SET writes over
--     its key, or, when nothing is granted, a DEL deletes it: `holder`; the same, in one
--     script, as a DEL before the grant), or when nothing holds it (no key, no live reader of the
--     read-write lock of this name). So each node holds at most one token at a time, as
--     with a try; a quorum of H is a Redlock quorum like any other.
--   * The waiter counts node i's grant from the send time of round r (the round in the
--     message): this node processed that try before the grant (the registration names r),
--     and the try left after its send time. So H lives here at least until that send time
--     plus the ttl (less drift), and the waiter's validity, from the quorum-th latest such
--     time among the granting nodes (core/flow.py: Acquire.heard), never outlasts its keys.
--   * Nothing removes H here while the waiter counts it but its expiry, the waiter's own
--     release or leave, and an operator's force release: a try of the waiter that meets H
--     answers granted and renews it (acquire.lua, the token's own branch); the clean-ups of
--     its failed rounds never delete a grant or a key a later try found, even when they run
--     late (hand_undo.lua skips a 'g' entry or a later round; hand_yield.lua only follows a
--     reply after which the waiter stops counting the node, and skips a later round).
--   * A node that restarted or failed over may have forgotten a holder: it grants only when
--     the process running this script is the one its marker names as fit to vote (the
--     identity node_rule.lua records, compared with node_identity.lua's here). A restored or
--     replicated marker names another process or history: no grant, only the wake-up, and the
--     waiter's own try meets the quarantine. `run`, when a release names the identity its
--     connection read (ARGV[3], appended by the transport as for an acquire), stands for
--     INFO's: a connection cannot outlive its server process, and one that met its node as a
--     replica is dropped (node_rule.lua says what is left), so it names the process running
--     this script (INFO costs more than the rest of the grant: benchmarks/script_cost.py).
--     '' or nil: INFO is read.
-- Fewer than a quorum of grants: the waiter keeps its place and goes on trying; its tries
-- answer granted where H is, and take free nodes where it heads the line. If it gives up,
-- it releases H on every node (core/flow.py: Acquire.judge). A waiter that died keeps its
-- grants until they expire (its ttl): only a head whose place has not lapsed is granted, and
-- a place lapses when its waiter stops trying.
-- `no_readers`: the caller saw in this script that the readers key does not exist (release.lua's
-- weighted EXISTS, nothing in release.lua writing it since), so the look at the last reader
-- is skipped: a ZRANGE of a missing key finds nothing, as an absent key has no live reader.
-- Absent or false (every other caller): looked at.
-- `holder`: a waiter's release (release.lua): the releaser's waiter id. Its key still holds
-- its token (compared by release.lua): the grant's SET writes over it, and every way out
-- that grants nothing deletes it (DEL), the same, in one script, as a DEL before the grant.
-- Its own place may remain in line (a node that queued it, then the others gave it a
-- quorum): live_head never takes it for the head, and it goes with the head's place (one
-- ZREM, one HDEL) when the lock is granted, else alone. Its lapse time is dropped only
-- when ZREM found its place: a place and its lapse time are written and dropped together
-- by every script (ZADD then HSET: acquire.lua's wait_in_line, hand_yield.lua, wait_line.lua's
-- take_place; ZREM with HDEL: acquire.lua's head and its own place, live_head, this function,
-- release.lua's other branch, leave.lua, wait_line.lua's leave_place and live_places; both
-- keys get the same expiry in the same script), so when ZREM finds no place there is no
-- lapse time to drop. Were one ever left (a key evicted by a misconfigured maxmemory
-- policy), it would be harmless: a lapse time is read only for a member found in line, and
-- every ZADD of a member writes its lapse time anew in the same script.
local function grant_next(key, line, lapse, lined, run, no_readers, holder)
    local first, now = live_head(key, line, lapse, lined, holder)
    local hand = key .. '\0h'
    local entry = first and redis.call('HGET', hand, first)
    if entry then
        local round, ttl, token, owner = string.match(entry, '^(%d+) (%d+) (%S+) (.+)$')
        local readers = no_readers and {}
            or redis.call('ZRANGE', key .. '\0r', -1, -1, 'WITHSCORES')
        local marker = redis.call('HGET', '\0django_redlock:node', 'run')
        if round ~= nil and (#readers < 2 or tonumber(readers[2]) <= now) and marker
            and (run ~= nil and run ~= '' and run
                or node_identity()) == marker then
            -- pcall: a node out of memory refuses the SET if it is the script's first
            -- write (no shebang; release.lua's DEL or HDEL comes first, so it grants); the
            -- head is then woken as before (and the releaser's key deleted: `holder`).
            if pcall(set_lock, key, token, owner, ttl) then
                if holder then
                    redis.call('ZREM', line, first, holder)
                    redis.call('HDEL', lapse, first, holder)
                else
                    redis.call('ZREM', line, first)
                    redis.call('HDEL', lapse, first)
                end
                -- Marked granted ('g'): the clean-up of a try whose reply was lost never
                -- deletes a grant the waiter may count (hand_undo.lua).
                redis.call('HSET', hand, first, 'g' .. entry)
                wake_member(key, first, first .. ' ' .. round)
                return
            end
        end
    end
    if holder then
        if redis.call('ZREM', line, holder) == 1 then
            redis.call('HDEL', lapse, holder)
        end
        redis.call('DEL', key)
    end
    if first then
        wake_member(key, first)
    end
end
