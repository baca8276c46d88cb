-- Included, before node_rule.lua or hand_grant.lua, by every script that judges whether this
-- node may vote: which server process runs the script, and which replication history the
-- data it serves comes from.
--
-- The identity is '<run_id>/<master_replid>' (INFO server, INFO replication). The run_id
-- names the process (never persisted: a restart has a new one). The replication id names the
-- history of the dataset: a replica promoted to master (REPLICAOF NO ONE, a Sentinel or a
-- managed service's failover) takes a new one, and so does a master that becomes a replica
-- and syncs from another (it takes its master's). So a node that found itself fit to vote
-- under one identity is judged again (node_rule.lua) after any of them, even when the same
-- process carries on: a failover keeps the process, not its master's last writes.
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
        .. (string.match(replication, 'master_replid:(%x+)') or ''), server, replication
end
