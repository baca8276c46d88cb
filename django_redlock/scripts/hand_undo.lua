-- Undo what a waiter's try may have done on a node whose reply was lost (core/flow.py:
-- Acquire._hand_clean_up), sent right behind that try on the same connection.
--
-- KEYS[1]  the lock key
-- KEYS[2]  the lock's wait line (sorted set of waiter ids by ticket)
-- KEYS[3]  the lapse times of the places in line (hash, ms on the node's clock)
-- ARGV[1]  the waiter's hand-off token H
-- ARGV[2]  the waiter id
-- ARGV[3]  the round of that try
--
-- Returns 1 when H was deleted here, 0 otherwise.
--
-- Why: a node that timed out may run the try late (a stalled server runs its queued input
-- when it wakes), perhaps after the waiter left: a key for H it takes then would hold the
-- lock for a waiter that is gone. So the key is deleted behind the try, as a failed round's
-- SET always was. But the waiter keeps one token for all its rounds, and after a stall reset
-- its later tries go on a newer connection, which the node may run first: a later round may
-- have found H here and the waiter may count it. So the key is deleted only if no later try
-- of this waiter ran here (hand_register.lua records the round of every try from round 2 on),
-- and never when the key is a grant (marked 'g' by hand_grant.lua): the waiter may count a
-- grant, never a key a try took whose reply it did not hear.
-- The next waiter in line is then granted the lock, or woken (hand_grant.lua).
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
if entry and (string.sub(entry, 1, 1) == 'g'
    or (tonumber(string.match(entry, '^(%d+) ')) or 0) > tonumber(ARGV[3])) then
    return 0 -- granted here (the waiter may count it), or a later try ran here
end
redis.call('DEL', KEYS[1])
grant_next(KEYS[1], KEYS[2], KEYS[3])
return 1
