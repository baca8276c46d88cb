-- Record on this node that other nodes' server processes were seen voting, so that
-- `redlock_declare_fresh` can tell a brand-new node (no other node ever saw it vote) from
-- one that restarted empty and may have forgotten locks (core/witness.py).
--
-- KEYS[1]  the voters hash (core/witness.py: VOTERS_KEY)
-- ARGV     pairs: a node's address (witness.field_of: host:port/db or unix:path?db=N), and
--          the run_id of its server process that was seen voting (or declared fresh)
--
-- Fields: each node's address -> '<run_id> <ms>' (this node's clock when last recorded);
-- 'born' -> '<this node's run_id> <ms>': when this node's current process began keeping the
-- record. Records live in this node's data, so they are only as complete as it is: a process
-- other than the one named in 'born' (a restart, from whatever file) may have lost some, and
-- starts 'born' again. A witness therefore trusts 'born' only while it names the current
-- process (voters_witness.lua). The hash expires 90 days after the last record.
--
-- Returns the number of nodes recorded.
local now = redis.call('TIME')
local ms = string.format('%d', tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000))
local run = string.match(redis.call('INFO', 'server'), 'run_id:(%x+)')
local born = redis.call('HGET', KEYS[1], 'born')
if not born or string.match(born, '^(%x+)') ~= run then
    redis.call('HSET', KEYS[1], 'born', run .. ' ' .. ms)
end
local count = 0
for i = 1, #ARGV - 1, 2 do
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1] .. ' ' .. ms)
    count = count + 1
end
redis.call('PEXPIRE', KEYS[1], 7776000000)
return count
