-- Release a semaphore lease on one node (whichever slot its token holds here), or only leave
-- the line; then wake the waiter that may now take a slot.
--
-- KEYS[1]  the semaphore's wait line (<base> .. "\0q"; waiters hear wake-ups on channels
--          named after <base>, see wait_line.lua)
-- KEYS[2]  the lapse times of the places in line (<base> .. "\0e")
-- KEYS[3…] the slots, in order (<base> .. 0, <base> .. 1, …; see semaphore_acquire.lua)
-- ARGV[1]  the lease token ("" to only leave the line: a blocking acquire that gave up)
-- ARGV[2]  the holder's waiter id ("" when it took its slot with a single try)
-- ARGV[3]  with ARGV[4]: the waiter's ticket, when this is the clean-up of a failed round of a
--          blocking acquire that goes on waiting (absent otherwise)
-- ARGV[4]  how long its place lasts without a new try, in ms (semaphore_acquire.lua's ARGV[7])
--
-- Returns 1 when a slot here held this token and was deleted, 0 otherwise (absent, expired,
-- or another holder's: another holder's slot is never deleted). The client frees the grants
-- of the nodes that answered another slot than the quorum's with this same script: it needs
-- no slot number, since a token holds at most one slot per node.
-- Wakes one waiter: with F slots now free, the F-th live place in line (the one this release
-- or this leave let into the first F); the ones before it could already take a slot.
--
-- The clean-up of a failed round of a waiter that goes on (ARGV[3], ARGV[4]) frees the slot
-- its try took here and puts its place back under its ticket (the grant dropped it): the
-- line keeps the same order on every node. Were the place left out, the slot freed here
-- would wake the next waiter in line here only, while the nodes that refused the try still
-- have this waiter first: two waiters each granted a minority, both failing, their clean-ups
-- waking more (W7 measured 3.8 rounds per acquire at 8 processes on 3 slots). It wakes no
-- one when the place woken would be its own: woken by itself, a waiter whose other nodes
-- still refuse would try again at once, again and again; it tries after its retry delay,
-- or when a release on another node wakes it.
-- No `#!lua` shebang: DEL needs no memory, so a full node still lets a holder release.
-- @include wait_line.lua
-- @include lock_key.lua
local line, lapse = KEYS[1], KEYS[2]
local base = string.sub(line, 1, -3)
local token, waiter = ARGV[1], ARGV[2]
local lifetime = tonumber(ARGV[4] or '')
local deleted = 0
local free = 0
for i = 3, #KEYS do
    local held = lock_token(KEYS[i])
    if token ~= '' and held == token then
        redis.call('DEL', KEYS[i])
        deleted = 1
        free = free + 1
    elseif held == false then
        free = free + 1
    end
end
local left = 0
if waiter ~= '' then
    if lifetime ~= nil then
        take_place(line, lapse, waiter, ARGV[3], lifetime)
    else
        left = leave_place(line, lapse, waiter)
    end
end
if (deleted == 1 or left == 1) and free > 0 and redis.call('EXISTS', line) == 1 then
    local places = live_places(line, lapse, free)
    if #places > 0 and (lifetime == nil or places[#places] ~= waiter) then
        wake(base, places[#places])
    end
end
return deleted
