-- Report whether this node votes now, by the very rule acquire.lua applies, without changing
-- anything (for `redlock_status`, the admin page and the managers' first contact).
--
-- KEYS[1]  the node's marker hash (see node_rule.lua)
-- ARGV[1]  the caller's quarantine in milliseconds
-- ARGV[2]  the node's persistence as the caller read it (node_rule.lua: 'always', ...)
--
-- Returns {verdict, detail, ms, q}: verdict 'votes' (detail: why: 'known', 'uptime', 'acknowledged',
-- 'durable') or 'quarantined' (detail: the refusal text; ms: until it votes, -1 when it
-- cannot tell); q: the longest quarantine this node has seen, in ms ('0' when none).
-- @include node_identity.lua
-- @include node_rule.lua
local refusal, detail = node_rule(KEYS[1], tonumber(ARGV[1]), ARGV[2], false)
local q = redis.call('HGET', KEYS[1], 'q') or '0'
if refusal == nil then
    return {'votes', detail, 0, q}
end
return {'quarantined', refusal, detail, q}
