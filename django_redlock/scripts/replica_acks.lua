-- Included by acquire.lua and extend.lua: the rule of a client that waits for its node's
-- replicas to acknowledge each grant and renewal (the node setting REPLICA_ACKS; the client
-- pipelines `WAIT <need> <ms>` right after the script and counts the node's vote only when
-- WAIT reports at least <need> replicas: wire/acks.py). The safety argument, and when a
-- promoted replica may then vote at once, is node_rule.lua's ("Replica acknowledgement").
--
-- The marker's field `a` (replicated with every grant, never cleared by a client) is the
-- claim that grants on this master count only once acknowledged: the largest REPLICA_ACKS
-- any client gave. Once it is there:
--   * a client without REPLICA_ACKS is refused (its grant would count unacknowledged, and a
--     promoted replica trusting the claim might lack it: redisson #5256's overlap);
--   * a client with it must wait for max(claim, the replicas online now) replicas: every
--     replica online at the grant acknowledges it, and never fewer than the floor. The count
--     is read here, at every grant, never cached (redisson #6518: a count read once misses a
--     replica that came back). A replica still syncing is not counted: its snapshot, taken
--     after this script, carries the grant. When the client's count differs, the grant is
--     refused before anything is written, with the count to use (the client retries with
--     it at once: wire/acks.py).
--
-- marker   the node's marker hash (NODE_KEY)
-- claimed  the marker's field a (text, or false when absent)
-- acks     the client's REPLICA_ACKS (text), or nil for a client without it
-- waiting  the replica count the client's WAIT asks for (text; nil without acks)
--
-- Returns nil when the grant may go ahead, else the error text (REPLICA_ACKS ...).

-- Replicas online now: INFO replication has a line 'slaveN:ip=...,state=online,...' each.
local function replicas_online()
    local _, count = string.gsub(redis.call('INFO', 'replication'), 'state=online', '')
    return count
end

local function replica_acks(marker, claimed, acks, waiting)
    local floor = tonumber(claimed or '0') or 0
    if acks == nil then
        if floor > 0 then
            return string.format(
                'REPLICA_ACKS this node counts a grant only once %d replica(s) acknowledged it '
                .. '(set by a client with REPLICA_ACKS); this client does not wait for its '
                .. 'replicas: give this node REPLICA_ACKS in every client', floor)
        end
        return nil
    end
    local own = tonumber(acks) or 0
    local need = math.max(floor, own, replicas_online())
    if tonumber(waiting) ~= need then
        return string.format(
            'REPLICA_ACKS need %d: the replicas online and the claim of this node; this '
            .. 'client waited for %s (it retries with the count)', need, tostring(waiting))
    end
    if own > floor then
        redis.call('HSET', marker, 'a', string.format('%d', own))
    end
    return nil
end
