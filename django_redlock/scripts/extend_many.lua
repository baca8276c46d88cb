-- Extend a multi-lock on one node: all of its keys or none.
--
-- KEYS[…]  the lock keys of the multi-lock
-- ARGV[1]  the lease token
-- ARGV[2]  the new lease length in milliseconds (positive integer), counted from now
--
-- Returns 1 when every key held this token and all expiries were reset; 0 otherwise, and then
-- nothing is renewed: a node that lost one of the keys no longer holds the lease (the keys it
-- still has run out by themselves). An absent key is never re-created (extend.lua).
for i = 1, #KEYS do
    if redis.pcall('HGET', KEYS[i], 't') ~= ARGV[1] then
        return 0
    end
end
for i = 1, #KEYS do
    redis.call('PEXPIRE', KEYS[i], ARGV[2])
end
return 1
