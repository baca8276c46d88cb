-- Included by acquire.lua before the lock is read: a waiter's hand-off registration, read by
-- hand_grant.lua when a release frees the lock here and by hand_undo.lua.
--
-- A blocking acquire of a plain lock tries with one token for all its rounds, its hand-off
-- token H (ARGV[1]; core/flow.py: Acquire.hand), and numbers its rounds (ARGV[8]: 1, 2, ...;
-- "" or 0 for every other acquire). Its tries record in the hash KEYS[1] .. "\0h" (field:
-- the waiter id) what a release needs to grant it the lock here at once:
-- "<round> <ttl ms> <H> <owner argument>". The grant publishes "<waiter id> <round>": the
-- round names the last try this node processed before the grant, so the waiter counts the
-- grant as made no earlier than that round's send time, in whatever order the reply and the
-- message reach it.
-- Which tries write it: one that queues the waiter (wait_in_line calls register_hand), and
-- every try of round 2 or later, queued or not, so the node knows the last round it ran: a
-- clean-up sent after a try whose reply was lost undoes nothing once a later try ran here
-- (hand_undo.lua). A waiter's first try that takes the lock (the uncontended acquire) writes
-- nothing. The hash lives a ttl past the last registration; an entry is dropped when its
-- waiter is granted, leaves or releases, or its place is found lapsed.
-- A try older than the last round this node ran for its waiter (it sat on a connection
-- replaced while the node stalled, and runs after a later try that came on a newer one) is
-- refused before it writes anything: it would take a key that its clean-up, which then
-- finds the later round recorded, leaves in place (hand_undo.lua). An entry marked 'g' is a
-- waiter granted the lock here (hand_grant.lua): its tries that meet the grant keep the mark.
-- A try of a waiter whose acquire is over here (the gone mark of its token, hand_gone.lua) is
-- refused the same way: it would queue a phantom at the head of the line. acquire.lua's fast
-- path reads the mark for round 1 (hand_checked).
local registered = false
local function register_hand()
    if registered or ARGV[8] == '' or ARGV[8] == '0' then
        return
    end
    registered = true
    local hand = KEYS[1] .. '\0h'
    local entry = ARGV[8] .. ' ' .. ARGV[2] .. ' ' .. ARGV[1] .. ' ' .. ARGV[3]
    -- A try that meets a grant keeps its mark (hand_grant.lua), so nothing undoes it.
    -- The entry as read by this script's check below, or by acquire.lua's fast path, when
    -- either ran (hand_seen): nothing wrote it since, as the only write of this hash in
    -- acquire.lua is this function's own HSET, which runs once and after this read (head()
    -- drops lapsed places from the line and the lapse times only), and the hash cannot expire
    -- in between (a script sees its keys' expiry at its start time). Read here otherwise.
    local old = hand_seen
    if old == nil then
        old = redis.call('HGET', hand, waiter)
    end
    if old and string.sub(old, 1, 1) == 'g' and lock_token(KEYS[1]) == ARGV[1] then
        entry = 'g' .. entry
    end
    redis.call('HSET', hand, waiter, entry)
    if redis.call('PTTL', hand) < tonumber(ARGV[2]) then
        redis.call('PEXPIRE', hand, ARGV[2])
    end
end
local hand_round = tonumber(ARGV[8]) or 0
-- (acquire.lua's fast path may have run this check for round 1 already: hand_checked.)
if waiter ~= '' and hand_round >= 1 and not hand_checked then
    hand_seen = redis.call('HGET', KEYS[1] .. '\0h', waiter)
    if hand_seen and (tonumber(string.match(hand_seen, '^g?(%d+) ')) or 0) > hand_round then
        return 0
    end
    -- The waiter's acquire is over here (its leave or release left the mark, and deleted any
    -- registration): a late try, refused before it writes anything (hand_gone.lua).
    if not hand_seen and redis.call('EXISTS', KEYS[1] .. '\0x' .. ARGV[1]) == 1 then
        return 0
    end
    if hand_round >= 2 then
        register_hand()
    end
end
