-- listing.lua on one shard of a cluster node: each lock key's owner and time left, for a
-- batch of keys of the slots this shard serves.
--
-- ARGV[1…]  lock keys in cluster form (wire/cluster.py: cluster_key), of any slots the shard
--           serves: as ARGV, not KEYS, because a cluster refuses a command whose KEYS span
--           slots, and one call per slot would be up to 16,384 calls for a listing. A script
--           without a flags line may read keys of any slot its shard serves.
--
-- Returns what listing.lua returns, in ARGV order. The owner records read are the shard's
-- own (the transport sends this script's variant for the shard: Script.for_shard).
-- @include lock_key.lua
-- @include lock_owner.lua
local out = {}
local records = {}
for i, key in ipairs(ARGV) do
    -- A user's key of another type under our prefix reads as "no owner", not an error.
    out[2 * i - 1] = owner_of(key, records)
    out[2 * i] = redis.call('PTTL', key)
end
return out
