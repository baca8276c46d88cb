-- Included by acquire.lua and vote_gate.lua: refuse a vote to a client whose quarantine is
-- shorter than one this node has seen, and tell it the longer one.
--
-- Why: a node that restarts without its data forgot the quarantine too (node_rule.lua); the
-- clients then bring it theirs. A client with a shorter max_ttl than another's, which
-- connected before that other client's first acquire, would bring the shorter one, and a
-- restarted node would vote again while a longer lease it granted still runs (found by the
-- simulator: tests/sim, profile 'quarantines'). Told here on any round that reaches a node
-- that remembers, the client raises its own (core/engine.py, Engine.failed) and tries again.
-- A client learns it on its first round after the longer one was seen, once per process; for
-- the hard guarantee every client of one set of nodes is given the same MAX_TTL.
--
-- stored      the marker's q field (text, or false when absent)
-- quarantine  the caller's quarantine in ms (number)
--
-- Returns nil, or the error text QUARANTINE_LONGER <ms> ... for redis.error_reply.
local function quarantine_longer(stored, quarantine)
    local known = tonumber(stored) or 0
    if known <= quarantine then
        return nil
    end
    return string.format(
        'QUARANTINE_LONGER %d ms: this node has seen leases that long (another client\'s '
        .. 'max_ttl); this client sent %d ms: it takes the longer one and tries again',
        known, quarantine)
end
