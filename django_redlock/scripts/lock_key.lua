-- Included by every script that reads or writes a lock key (a lock, a write lease, a semaphore
-- slot): the key's layout, in one place (core/owner.py makes the owner argument). Scripts that
-- write lock keys include lock_write.lua after it; those that show owners lock_owner.lua.
--
-- A lock key is a string '<token> <tag>' with the lease's expiry; the tag is the owner id (7
-- characters of [A-Za-z0-9_-]) then acquired_at (ms since the epoch, base 36). The owner's
-- record (host, pid, thread, task, origin: JSON up to its "acquired_at": value) is stored once
-- per owner, in a string key shared by all of that owner's locks (the owner key) that
-- outlives them. Why: a hash (t = token, o = owner JSON) cost 427 bytes per held lock, its
-- owner field being above hash-max-listpack-value; a value of at most 56 bytes costs about
-- what a plain SET lock does (docs/explanation/benchmarks.md).
--
-- The owner argument of the granting scripts is '<tag> <record>'. Keys of another type (a
-- hash lock of a version before this layout, during a rolling upgrade; a user's key) fail GET
-- with WRONGTYPE (pcall): held by someone else, never ours, never written over or deleted.
--
-- The owner key is '\0o:<owner id>:django_redlock:node', its name made by the scripts, not
-- passed in KEYS: the nodes are independent servers (never a Redis Cluster), and it ends like
-- the node marker's name, so the ACL pattern a locks user already has for the marker
-- (~*django_redlock:node) covers it.
--
-- Cost: the hot scripts define as few local functions as they need (each is a closure made on
-- every call, about 0.07 us), and the acquire's fast path adds one PTTL (the owner key) to
-- what a hash took (SET ... PX replaces HSET + PEXPIRE).

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
