-- What this node remembers of another node's votes (voters_record.lua), for
-- `redlock_declare_fresh` (core/witness.py). Read-only.
--
-- KEYS[1]  the voters hash (core/witness.py: VOTERS_KEY)
-- ARGV[1]  the other node's address (witness.field_of)
--
-- Returns {record, kept}: record is '<run_id> <ms ago>' of the last process of that node seen
-- voting, or '' when none was recorded here; kept is how many ms this node's current process
-- has kept the record (since 'born'), or -1 when it has not (no record at all, or 'born'
-- names an earlier process, which may have lost records). Both ages are on this node's clock.
local now = redis.call('TIME')
local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local run = string.match(redis.call('INFO', 'server'), 'run_id:(%x+)')
local found = redis.call('HMGET', KEYS[1], 'born', ARGV[1])
local kept = -1
if found[1] then
    local born_run, born_ms = string.match(found[1], '^(%x+) (%d+)$')
    if born_run == run then
        kept = ms - tonumber(born_ms)
    end
end
local record = ''
if found[2] then
    local seen_run, seen_ms = string.match(found[2], '^(%x+) (%d+)$')
    record = (seen_run or '?') .. ' ' .. string.format('%d', ms - (tonumber(seen_ms) or ms))
end
return {record, kept}
