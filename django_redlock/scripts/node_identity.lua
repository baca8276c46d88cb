-- Included, before node_rule.lua or hand_grant.lua, by every script that judges whether this
-- node may vote: which server process runs the script, and which replication history the
-- data it serves comes from.
--
-- The identity is '<run_id>/<master_replid2>:<second_repl_offset>' (INFO server, INFO
-- replication). The run_id names the process (never persisted: a restart has a new one). The
-- other two name its promotions: a master that was never a replica in this process's life
-- has '0000...:-1'; a promotion (REPLICAOF NO ONE, a Sentinel's or a managed service's
-- failover) sets them to the replication id it served as a replica and the offset it was
-- promoted at, different at every promotion (a demoted master that syncs from another and is
-- promoted again included). So a node found fit to vote under one identity is judged again
-- (node_rule.lua) after any promotion, even when the same process carries on: a failover
-- keeps the process, not its master's last writes. Not master_replid itself: a master takes
-- a new one when its first replica attaches, which loses nothing (the connections opened
-- before would no longer match the marker, and pay INFO on every acquire).
--
-- Returns the identity, then the INFO server and INFO replication texts; nil when the lock
-- user may not run INFO (an ACL without +info).
local function node_identity()
    local server = redis.pcall('INFO', 'server')
    local replication = redis.pcall('INFO', 'replication')
    if type(server) ~= 'string' or type(replication) ~= 'string' then
        return nil
    end
    return (string.match(server, 'run_id:(%x+)') or '') .. '/'
        .. (string.match(replication, 'master_replid2:(%x+)') or '') .. ':'
        .. (string.match(replication, 'second_repl_offset:(%-?%d+)') or ''), server, replication
end
