-- Included by acquire.lua and node_state.lua (see `_script` in redlock.py): may this node
-- vote, or has it restarted too recently to know which locks it forgot?
--
-- Why (the Redis distlock page, "Performance, crash recovery and fsync": delayed restarts;
-- Kleppmann, "How to do distributed locking", 2016, on persistence): a node that restarts
-- without its data forgot the locks it granted; if it voted at once, a second client could
-- win a quorum with it while the first holder's lease still runs. So a restarted node waits
-- until every lease it may have granted has run out: the quarantine, the longest lease any
-- client may take (its `max_ttl`).
--
-- The rule, on the node's own process (INFO server: run_id and uptime, never persisted, so a
-- marker restored from an RDB snapshot or an AOF proves nothing about the new process):
--   * a process that has been up longer than the quarantine votes (whatever it forgot has
--     expired);
--   * a process that a client proved durable (appendonly yes + appendfsync always, read with
--     CONFIG GET; checked here with INFO persistence) votes: it forgot nothing;
--   * a process that an operator declared fresh (declare_fresh.lua, naming its run_id) votes;
--   * otherwise it refuses, and says when it will vote.
-- A process found fit is recorded in the marker hash (run = its run_id), so the acquire hot
-- path compares one string instead of calling INFO (see acquire.lua).
--
-- The quarantine is the largest one any client ever sent to this node (field q, kept across
-- restarts as far as the node keeps data, and recorded whether the node votes or refuses) or
-- the caller's, whichever is larger: a client with a small max_ttl never shortens the wait for
-- a long lease another client took. A node that
-- lost everything lost q too; the clients then bring it the largest q the other nodes report
-- (they read it when they connect).
--
-- marker      the node's marker hash (run, q, why)
-- quarantine  the caller's quarantine in ms
-- fsync       what the caller read with CONFIG GET: 'always' (appendonly yes and appendfsync
--             always), else a short text for the refusal ('appendonly no', 'appendfsync
--             everysec', 'CONFIG GET refused', '' when not read yet)
-- commit      record a verdict of "votes" in the marker (acquire) or only report it (status)
--
-- Returns: nil when the node votes (and why: 'known', 'uptime', 'durable'), or an error text
-- that starts with QUARANTINED; then the ms until it votes (or -1 when it cannot tell).
local function node_rule(marker, quarantine, fsync, commit)
    local stored = redis.call('HMGET', marker, 'run', 'q')
    local q = math.max(quarantine, tonumber(stored[2] or '0') or 0)
    local server = redis.pcall('INFO', 'server')
    if type(server) ~= 'string' then
        return 'QUARANTINED the lock user may not run INFO, so this node cannot tell whether '
            .. 'it restarted; grant it +info', -1
    end
    local run = string.match(server, 'run_id:(%x+)')
    -- uptime_in_seconds counts from a whole second at or before the start: one second less
    -- is never more than the true uptime.
    local up = math.max(0, tonumber(string.match(server, 'uptime_in_seconds:(%d+)')) - 1) * 1000
    local why
    if stored[1] == run then
        why = 'known'
    elseif up >= q then
        why = 'uptime'
    elseif fsync == 'always'
        and string.find(redis.call('INFO', 'persistence'), 'aof_enabled:1', 1, true) then
        why = 'durable'
    else
        if commit and q > (tonumber(stored[2] or '0') or 0) then
            -- Remembered even while refusing: a client with a longer max_ttl than the ones
            -- this process has heard from may hold a lease this node granted before it lost
            -- its data; a shorter quarantine sent later must not end the wait before that
            -- lease runs out (found by the simulator: tests/sim, profile 'quarantines').
            redis.call('HSET', marker, 'q', string.format('%d', q))
        end
        local detail = fsync
        if detail == 'always' then
            detail = 'AOF is off in INFO persistence'
        elseif detail == '' then
            detail = 'durability not checked yet'
        end
        return string.format(
            'QUARANTINED up %d s, not proven durable (%s): votes again in %d s',
            math.floor(up / 1000), detail, math.ceil((q - up) / 1000)), q - up
    end
    if commit and (why ~= 'known' or tonumber(stored[2] or '0') ~= q) then
        redis.call('HSET', marker, 'run', run, 'q', string.format('%d', q))
        if why ~= 'known' then
            redis.call('HSET', marker, 'why', why)
        end
    end
    return nil, why
end
