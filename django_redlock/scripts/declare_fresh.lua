-- Declare one node's current process fresh: it votes at once, with no restart quarantine.
--
-- KEYS[1]  the node's marker hash (see node_rule.lua)
-- ARGV[1]  the run_id the operator's client read from INFO server just before
--
-- Only for a brand-new node, or one shut down cleanly with its data (no lease it granted can
-- be forgotten). The declaration names the process and its replication history (the identity
-- of node_identity.lua): any later restart (empty, from an RDB snapshot, from an `everysec`
-- AOF) or failover has another identity and is judged by node_rule.lua again, even if this
-- marker was saved in a snapshot or replicated.
-- Returns {'declared', identity}; the error RESTARTED when the node's run_id is no longer the
-- one named (it restarted between the read and this call: declare again, knowingly); the
-- error REPLICA when the node is a replica (it never votes: declare its master).
-- @include node_identity.lua
local me, server, replication = node_identity()
local run = string.match(server, 'run_id:(%x+)')
if run ~= ARGV[1] then
    return redis.error_reply(
        'RESTARTED the node restarted since its run_id was read (' .. ARGV[1] .. ', now '
        .. run .. '); nothing declared')
end
if string.match(replication, 'role:(%a+)') ~= 'master' then
    return redis.error_reply('REPLICA this node is a replica: it never votes; nothing declared')
end
redis.call('HSET', KEYS[1], 'run', me, 'why', 'declared')
-- As node_rule.lua's record_self: this node's own process is fit, so a durable restart of it
-- keeps voting; written to this node's AOF only, never to its replicas.
redis.set_repl(redis.REPL_AOF)
redis.call('HSET', KEYS[1], 'self', me)
redis.set_repl(redis.REPL_ALL)
return {'declared', me}
