-- Included by every script that reads or writes a lock key (a lock, a write lease, a semaphore
-- slot): the key's layout, in one place (core/owner.py makes the owner argument). Scripts that
-- write lock keys include lock_write.lua after it; those that show owners lock_owner.lua.
--
-- A lock key is a string '<token> <tag>' with the lease's expiry; the tag is the owner id (7
-- characters of [A-Za-z0-9_-]) then acquired_at (ms since the epoch, base 36). The owner's
-- record (host, pid, thread, task, origin: JSON up to its "acquired_at": value) is stored once
-- per owner, in a string key shared by all of that owner's locks (owner_key below) that
-- outlives them. Why: a hash (t = token, o = owner JSON) cost 427 bytes per held lock, its
-- owner field being above hash-max-listpack-value; a value of at most 56 bytes costs about
-- what a plain SET lock does (docs/explanation/benchmarks.md).
--
-- The owner argument of the granting scripts is '<tag> <record>'. Keys of another type (a
-- hash lock of a version before this layout, during a rolling upgrade; a user's key) fail GET
-- with WRONGTYPE (pcall): held by someone else, never ours, never written over or deleted.
--
-- The owner key's name is made here, not passed in KEYS: the nodes are independent servers
-- (never a Redis Cluster), and it ends like the node marker's name, so the ACL pattern a
-- locks user already has for the marker (~*django_redlock:node) covers it.
local function owner_key(id)
    return '\0o:' .. id .. ':django_redlock:node'
end

-- The token a lock key holds: a string; false when the key is absent; a table (truthy, equal
-- to no token) when the key is not a lock: of another type, or a string without a space.
local function lock_token(key)
    local value = redis.pcall('GET', key)
    if type(value) ~= 'string' then
        return value
    end
    local space = string.find(value, ' ', 1, true)
    if space == nil then
        return {err = 'not a lock'}
    end
    return string.sub(value, 1, space - 1)
end

-- acquired_at of a tag, in seconds as the owner record's JSON has it (to the ms).
local function acquired_at(tag)
    return string.format('%.3f', (tonumber(string.sub(tag, 8), 36) or 0) / 1000)
end
