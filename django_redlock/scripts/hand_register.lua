-- Included by acquire.lua, and called when a try queues its waiter (wait_in_line): the
-- waiter's hand-off registration, read by hand_grant.lua when a release frees the lock here.
--
-- A blocking acquire of a plain lock tries with one token for all its rounds, its hand-off
-- token H (ARGV[1]; core/flow.py: Acquire.hand), and numbers its rounds (ARGV[8]: 1, 2, ...;
-- "" or 0 for every other acquire). Each of its tries that queues it records in the hash
-- KEYS[1] .. "\0h" (field: the waiter id) what a release needs to grant it the lock here at
-- once: "<round> <ttl ms> <H> <owner argument>". The grant publishes "<waiter id> <round>":
-- the round names the last try this node processed before the grant, so the waiter counts
-- the grant as made no earlier than that round's send time, in whatever order the reply and
-- the message reach it. The hash lives a ttl past the last registration (an entry is dropped
-- when its waiter is granted, leaves, or its place is found lapsed); a try that takes the
-- lock, the uncontended one included, writes nothing here.
-- A try whose reply the waiter did not hear is followed, on the same connection, by a release
-- of H (core/flow.py: Acquire.judge): a late try that takes the lock here for a waiter that
-- is gone is undone right after it, as a failed round's clean-up always was.
local function register_hand()
    if ARGV[8] == '' or ARGV[8] == '0' then
        return
    end
    local hand = KEYS[1] .. '\0h'
    redis.call('HSET', hand, waiter, ARGV[8] .. ' ' .. ARGV[2] .. ' ' .. ARGV[1] .. ' ' .. ARGV[3])
    if redis.call('PTTL', hand) < tonumber(ARGV[2]) then
        redis.call('PEXPIRE', hand, ARGV[2])
    end
end
