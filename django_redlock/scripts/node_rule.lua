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
-- A failover is the same loss by another road. Replication is asynchronous: a lock its
-- master granted may not have reached the replica when the master died, and the replica,
-- promoted (REPLICAOF NO ONE: what Sentinel and every managed Redis with automatic failover
-- do), serves a dataset without it. Its process has been up for days and its AOF, however
-- durable, holds only what it replicated: neither uptime nor fsync proves anything about the
-- writes it never received. So a promoted replica waits the quarantine too, counted from the
-- promotion; INFO does not say when that was, so from when a script first saw this node as a
-- promoted master (recorded in the marker, field p, under the new replication id), which is
-- never earlier.
--
-- The rule, on the node's own process and promotions (node_identity.lua: run_id, never
-- persisted, and its promotion history, new at every promotion; so a marker restored from a
-- snapshot or replicated from another master proves nothing about this node):
--   * a replica never votes (its master is the node; a replica that accepts writes, with
--     replica-read-only no, would otherwise grant what its master never sees);
--   * a master that was promoted in this process's life (INFO replication: second_repl_offset
--     is not -1; a restart, even from an RDB file or an AOF, leaves it at -1) votes once the
--     quarantine has passed since its promotion was first seen;
--   * a promoted master whose marker carries the replica-acknowledgement claim (field a,
--     below) votes at once;
--   * any other master that has been up longer than the quarantine votes (whatever it forgot
--     when it started has expired);
--   * a master that was never promoted and that a client proved durable (appendonly yes +
--     appendfsync always, read with CONFIG GET; checked here with INFO persistence) votes: it
--     forgot nothing its previous process had. That proves enough only when that previous
--     process was itself fit to vote on this very node: so the marker's field `self`, written
--     with redis.set_repl(redis.REPL_AOF) (into this node's AOF, never to its replicas), must
--     name the same fit identity as `run`. A replica promoted and restarted before it served
--     its quarantine (its dataset lacks what its old master granted; `run` was cleared, or is
--     its old master's, replicated without `self`), or a process that was refused and then
--     restarted, is quarantined again, the wait counted from the restart (found by the
--     simulator: seed 510184006, profile failovers). A node with no marker at all (brand new)
--     has nothing to forget. What is left, stated so: a full sync copies the master's memory,
--     `self` included, so a replica that synced after its master was found fit, promoted,
--     then crashed and restarted from its own durable AOF before any client reached it as a
--     master (which clears `run`), all within one lease, passes for its master's durable
--     restart (tests/core/test_failover.py keeps it as a strict xfail). Nothing the new
--     process can read tells the two apart: INFO gives a restarted master a new replication
--     id either way. And a durable node that restarts with nothing at all passes for a
--     brand-new one: a replica killed after its full sync and before the AOF rewrite that
--     follows it finished (its AOF is then empty; seen on Redis 7), or AOF files an operator
--     removed;
--   * a process that an operator declared fresh (declare_fresh.lua, naming its identity) votes;
--   * otherwise it refuses, and says when it will vote.
-- A node found fit is recorded in the marker hash (run = its identity), so the acquire hot
-- path compares one string instead of calling INFO (see acquire.lua): the identity the
-- client's connection read when it connected (wire/setup.py). Clients drop a connection that
-- meets a replica (the REPLICA refusal below, or READONLY), so that a connection which lived
-- through a demotion and a promotion reads the new identity, and a promoted node clears the
-- identity its marker names when it first sees its promotion (below), so a node that syncs
-- from it later never finds its own old identity there. What is left, stated so: a
-- connection opened before its node was demoted, that met no READONLY or replica refusal
-- while the node was a replica (it sent nothing then, or the replica accepted writes:
-- replica-read-only no), to a node whose new master no client reached while it was master,
-- within one lease: the old identity would still match. Sentinel closes every client
-- connection when it reconfigures a node (CLIENT KILL TYPE normal), so a Sentinel-managed
-- node never keeps one; never set replica-read-only no on a lock node's replicas.
--
-- Replica acknowledgement (issue 39; the node setting REPLICA_ACKS; replica_acks.lua and
-- wire/acks.py): when may a promoted replica vote at once? When it holds every lease its old
-- master granted that a client counted. The rule and why it holds:
--   * A client with REPLICA_ACKS k pipelines `WAIT <need> <ms>` right after each grant or
--     renewal (one round trip) and counts the node's vote only when WAIT reports >= need
--     replicas, need = max(k, the claim a, the replicas online when the script ran), checked
--     by the script (replica_acks.lua), which records the claim `a` before it grants. A WAIT
--     that times out, is refused (a provider that forbids it: redisson #3474) or counts
--     fewer, and a connection lost before its reply, are a no: the node is not counted, its
--     key is released like any key of a failed attempt. <ms> stays inside the node timeout,
--     so a stalled replica costs one node timeout, never a hang (redisson #4798).
--   * The claim is sticky: a client without REPLICA_ACKS is refused on a node that carries
--     it. So from the moment the claim is in a master's data, every grant and renewal that
--     counted there was acknowledged by every replica online at it, and by at least k.
--   * A promoted replica P holds its old master M's data up to some replication offset X.
--     Suppose P's copy of the marker has the claim. A counted grant g after X would have been
--     acknowledged by >= need >= 1 replicas, each then at an offset past g, so past X. Then
--     (a) P did not acknowledge g (a replica whose link was down is not online, is not
--     waited for, and may still be promoted: redisson #5256), and (b) P is behind every
--     replica that did. So P holds every counted grant when it was promoted as the most
--     advanced replica left and one that acknowledged the last counted grant is still there (Sentinel promotes the
--     most advanced among replicas of the same replica-priority; so do managed services).
--     The operator's part, stated in the docs: give a lock node's replicas the same
--     replica-priority, never promote by hand a replica that lags, and set k to at least 1
--     (k = the number of replicas makes (b) impossible: every replica must acknowledge).
--     That is why "every replica online acknowledged" alone is not enough, and why the floor
--     k >= 1 matters (with no replica online, nothing would be waited for).
--   * Grants counted before the claim reached M's data are in P's copy too (P holds M's
--     history up to X, and the claim came before X). What is left, stated so: a lease taken
--     by a client without REPLICA_ACKS before the first acknowledged grant and renewed by it
--     afterwards (renewals of such a client are not refused: that would cost every renewal a
--     marker read); switch a node to REPLICA_ACKS when no client without it holds a lease,
--     or wait one lease after the switch before relying on it. A replica of a replica is not
--     counted by WAIT: never let one be promoted (replica-priority 0).
-- Turning acknowledgement off is an operator's step: stop the clients that use it, then
-- HDEL the field a and WAIT for every replica on the same connection (a replica that kept the
-- claim would otherwise trust it for grants made without acknowledgement).
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
-- Returns: nil when the node votes (and why: 'known', 'uptime', 'promoted', 'acknowledged',
-- 'durable'), or an
-- error text that starts with QUARANTINED; then the ms until it votes (or -1 when it cannot
-- tell: a replica, or INFO refused).
-- Record in the marker (field self) that this node's own process `me` was found fit, in its
-- AOF and memory only: a replica never receives it, so a dataset replicated or promoted from
-- another node never carries it (the durable rule below).
local function record_self(marker, me)
    redis.set_repl(redis.REPL_AOF)
    redis.call('HSET', marker, 'self', me)
    redis.set_repl(redis.REPL_ALL)
end

local function node_rule(marker, quarantine, fsync, commit)
    local stored = redis.call('HMGET', marker, 'run', 'q', 'p', 'self', 'a')
    local q = math.max(quarantine, tonumber(stored[2] or '0') or 0)
    local me, server, replication = node_identity()
    if me == nil then
        return 'QUARANTINED the lock user may not run INFO, so this node cannot tell whether '
            .. 'it restarted or failed over; grant it +info', -1
    end
    if string.match(replication, 'role:(%a+)') ~= 'master' then
        return string.format(
            'QUARANTINED this node is a replica (of %s:%s), not a master: it never votes; '
            .. 'list its master as the node, or its Sentinels',
            string.match(replication, 'master_host:([^\r\n]*)') or '?',
            string.match(replication, 'master_port:(%d+)') or '?'), -1
    end
    -- uptime_in_seconds counts whole seconds: one second less than a difference of two of
    -- its readings (or than one reading: it counts from a whole second at or before the
    -- start) is never more than the true time between them.
    local uptime = tonumber(string.match(server, 'uptime_in_seconds:(%d+)'))
    local up = math.max(0, uptime - 1) * 1000
    -- How long this process has served its dataset as a master, in ms: its uptime, or, for a
    -- promoted replica, the time since its promotion was first seen (field p: '<promotion>
    -- <uptime_in_seconds then>', the promotion as node_identity.lua names it).
    local promoted = (tonumber(string.match(replication, 'second_repl_offset:(%-?%d+)')) or -1) >= 0
    local since = up
    if promoted then
        local promotion = string.sub(me, string.find(me, '/', 1, true) + 1)
        local seen, at = string.match(stored[3] or '', '^(%S+) (%d+)$')
        if seen == promotion then
            since = math.max(0, uptime - tonumber(at) - 1) * 1000
        else
            since = 0
            -- Recorded whoever asks (a status check too): the wait starts at the first sight.
            -- The identity of the process found fit before (its old master's, replicated) is
            -- cleared at once: a node that syncs from this one later (its old master, demoted
            -- and promoted again) must not find its own old identity here and vote on the
            -- hot path. pcall: a status user without write rights still gets its answer.
            redis.pcall('HSET', marker, 'p', promotion .. ' ' .. string.format('%d', uptime),
                'run', '')
        end
    end
    local why
    if stored[1] == me then
        why = 'known'
    elseif since >= q then
        why = promoted and 'promoted' or 'uptime'
    elseif promoted and (tonumber(stored[5] or '0') or 0) > 0 then
        -- Every grant its old master counted was acknowledged (see above): none is missing.
        why = 'acknowledged'
    elseif not promoted and fsync == 'always' and stored[4] == stored[1]
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
        if commit and stored[1] ~= '' and (fsync == 'always' or string.sub(fsync, 1, 6) == 'append')
        then
            -- The dataset no longer comes from a process fit to vote (nor from a brand-new
            -- node): a durable restart of this one must not pass for one of a fit process
            -- (the durable rule above). Only when the caller knows the node's persistence: a
            -- refusal for want of it ('' before its connection read CONFIG GET, or CONFIG GET
            -- refused) says nothing of the process.
            redis.call('HSET', marker, 'run', '')
        end
        if promoted then
            return string.format(
                'QUARANTINED a replica promoted to master (first seen %d s ago): it may have '
                .. 'missed the last locks its old master granted; it votes again in %d s',
                math.floor(since / 1000), math.ceil((q - since) / 1000)), q - since
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
        redis.call('HSET', marker, 'run', me, 'q', string.format('%d', q))
        if why ~= 'known' then
            redis.call('HSET', marker, 'why', why)
            record_self(marker, me)
        end
    end
    return nil, why
end
