-- Included, after node_rule.lua, by every script of wire/primitives.py that grants (semaphore,
-- read-write lock, multi-lock, hand-off): the very gate acquire.lua applies before it grants.
--
-- Hot path: the marker names the process already found fit to vote, and the connection the
-- command came on named the process it talks to (its identity, appended by the transport as the
-- second-to-last ARGV): equal strings, so no INFO call. Otherwise node_rule.lua decides, and a
-- node that may have forgotten grants it made before a restart refuses with QUARANTINED.
--
-- marker      the node's marker hash (NODE_KEY)
-- quarantine  the caller's quarantine in ms (text)
-- run         the identity the connection read (node_identity.lua; '' when not known yet)
-- fsync       the node's persistence as the connection read it (node_rule.lua)
--
-- On a node whose grants count only once its replicas acknowledged them (marker field a, the
-- claim of replica_acks.lua), these scripts refuse: none of them is followed by WAIT, and a
-- promoted replica trusts the claim to vote at once (node_rule.lua, "Replica
-- acknowledgement"), so one grant of theirs that it missed would be a second holder.
--
-- Returns nil when the node votes, else the QUARANTINED (or REPLICA_ACKS) error text (for
-- redis.error_reply).
local function vote_gate(marker, quarantine, run, fsync)
    local q = tonumber(quarantine)
    local stored = redis.call('HMGET', marker, 'run', 'q', 'a')
    if stored[3] then
        return 'REPLICA_ACKS this node counts a grant only once its replicas acknowledged it; '
            .. 'semaphores, read-write locks, multi-locks and hand-offs are not acknowledged: '
            .. 'take plain locks on it, or list it without REPLICA_ACKS after clearing the claim '
            .. '(the deploying page, "Replica acknowledgement")'
    end
    local longer = quarantine_longer(stored[2], q)
    if longer ~= nil then
        return longer
    end
    -- An empty identity (an EVAL after NOSCRIPT carries none) never matches a cleared run
    -- (see acquire.lua).
    if run == nil or run == '' or stored[1] ~= run then
        return node_rule(marker, q, fsync, true)
    end
    if (tonumber(stored[2]) or 0) < q then
        -- Remember the longest quarantine any client uses (see node_rule.lua).
        redis.call('HSET', marker, 'q', quarantine)
    end
    return nil
end
