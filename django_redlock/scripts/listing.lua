-- Read what an operator listing shows of lock keys: each one's owner and time left, for a
-- whole batch of keys in one call (one command per key made a listing of 50,000 locks take
-- seconds in the client, most of it spent encoding and parsing commands).
--
-- KEYS[1…]  lock keys as acquire.lua, acquire_many.lua and semaphore_acquire.lua write them:
--           a string per lock, write lease or semaphore slot (lock_key.lua)
--
-- Returns a flat array, two entries per key in KEYS order: the owner record JSON (nil when
-- the key is absent or is not a lock; lock_key.lua rebuilds it from the key and its owner
-- key, each owner key read once per call) and the key's remaining milliseconds
-- (PTTL: -2 when the key is absent, -1 when it has no expiry). Never the token.
-- Read-only (a shebang would be allowed here, but plain EVAL keeps all scripts alike); the
-- work is bounded by the number of keys the caller sends (1,000 at most).
-- @include lock_key.lua
-- @include lock_owner.lua
local out = {}
local records = {}
for i, key in ipairs(KEYS) do
    -- A user's key of another type under our prefix reads as "no owner", not an error.
    out[2 * i - 1] = owner_of(key, records)
    out[2 * i] = redis.call('PTTL', key)
end
return out
