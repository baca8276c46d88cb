-- After a failed round of a waiter that takes hand-off grants (core/flow.py: Acquire.judge),
-- on each node that answered its try with its token: keep the lock if no older waiter is in
-- line here, else give it to the older one.
--
-- KEYS[1]  the lock key
-- KEYS[2]  the lock's wait line (sorted set of waiter ids by ticket)
-- KEYS[3]  the lapse times of the places in line (hash, ms on the node's clock)
-- ARGV[1]  the waiter's hand-off token H
-- ARGV[2]  the waiter id
-- ARGV[3]  the waiter's ticket (its place: the same number on every node)
-- ARGV[4]  how long a place in line lasts without a new try, in milliseconds
-- ARGV[5]  the round whose try answered with H here (the failed round this yield follows)
--
-- Returns 1 when the lock still holds H here, 0 otherwise (not held, or given away).
--
-- Why: the nodes may disagree on who heads the line (a waiter's first try takes a free lock
-- on a node whose line is empty before it queues anywhere else; a place lapsed on one node
-- only). A waiter that kept every node it took would then hold a minority while another
-- holds another minority, and neither would reach a quorum until their keys expire. So each
-- failed round yields what the waiter took to the oldest live waiter of that node's line
-- (granted to it as a release would: hand_grant.lua), and the waiter queues again with its
-- own ticket: every split resolves in favour of the oldest ticket, the order every node
-- agrees on. The waiter does not count a node it sent this to until a later reply (it cannot
-- know which way it went); hand_grant.lua has the safety argument of the grant itself.
-- A yield can run late: sent behind its round's try, it may sit on a connection replaced
-- while the node stalled, and the waiter's next try, on the new connection, may run first,
-- renew H and be counted in a round that wins. So a yield does nothing once a later try of
-- this waiter ran here (hand_register.lua records the round of every try from round 2 on),
-- as hand_undo.lua: else it would give a counted key to another waiter (two holders).
-- No `#!lua` shebang, as release.lua.
-- @include wake_next.lua
-- @include lock_key.lua
-- @include lock_write.lua
-- @include node_identity.lua
-- @include hand_grant.lua
if lock_token(KEYS[1]) ~= ARGV[1] then
    return 0
end
local entry = redis.call('HGET', KEYS[1] .. '\0h', ARGV[2])
if entry and (tonumber(string.match(entry, '^g?(%d+) ')) or 0) > tonumber(ARGV[5]) then
    return 1 -- a later try ran here: what it found is the waiter's to count
end
local first = live_head(KEYS[1], KEYS[2], KEYS[3])
if first == nil or first == ARGV[2]
    or tonumber(redis.call('ZSCORE', KEYS[2], first)) >= tonumber(ARGV[3]) then
    return 1
end
redis.call('DEL', KEYS[1])
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
redis.call('ZADD', KEYS[2], 'NX', ARGV[3], ARGV[2])
redis.call('HSET', KEYS[3], ARGV[2], string.format('%d', now + tonumber(ARGV[4])))
for _, key in ipairs({KEYS[2], KEYS[3]}) do
    if redis.call('PTTL', key) < tonumber(ARGV[4]) then
        redis.call('PEXPIRE', key, ARGV[4])
    end
end
grant_next(KEYS[1], KEYS[2], KEYS[3])
return 0
