-- Included by every script that reads or writes a lock key (a lock, a write lease, a semaphore
-- slot): the key's layout, in one place.
--
-- A lock key is a string '<token> <owner id> <acquired_at>' with the lease's expiry. The owner
-- record (host, pid, thread, task, origin) lives once per owner, in a string key shared by all
-- of that owner's locks on the node: OWNER_KEY_FORMAT below, holding the record's JSON up to
-- its "acquired_at": value, so record .. acquired_at .. '}' is the whole record.
--
-- Why (issue 28): a hash (t = token, o = owner JSON) cost 427 bytes per held lock, as its
-- ~104-byte owner field is above hash-max-listpack-value (64) and turns the hash into a
-- hashtable. A string of at most 72 bytes stays one allocation: ~150 bytes per held lock on
-- Valkey 9 (redis-py's Lock: ~120 with the same key names), and the owner costs one key per
-- owner, not per lock (measured in docs/explanation/benchmarks.md).
--
-- The owner argument every granting script takes is '<owner id> <acquired_at> <record>'
-- (core/owner.py): the id is 12 characters of [A-Za-z0-9_-] naming the record (a digest of
-- it, so equal records share one key), acquired_at the client's time in seconds.
--
-- Keys of another type (a hash written by a version before this layout, during a rolling
-- upgrade, or a user's key) make GET fail with WRONGTYPE: pcall, and such a key is held by
-- someone else, never ours, never overwritten, never deleted.
--
-- The owner key's name is made here, not passed in KEYS: every node is an independent server
-- (never a Redis Cluster, where undeclared keys would be refused), and its name ends like the
-- node marker's, so the ACL pattern ~*django_redlock:node that a locks user already has for
-- the marker (docs/howto/deploying.md) covers it.
local function owner_key(id)
    return '\0o:' .. id .. ':django_redlock:node'
end

-- The token a lock key holds: a string; false when the key is absent; a table (an error
-- reply, truthy and equal to no token) when the key is not a lock: of another type, or a
-- string without the space every lock of ours has after its token (a user's value).
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

-- The owner argument's parts: '<owner id> <acquired_at>' (what the lock key keeps), the id,
-- and the record. Raises when it is malformed (a caller's bug), before the key is written.
local function owner_parts(owner)
    local first = string.find(owner, ' ', 1, true)
    local second = first and string.find(owner, ' ', first + 1, true)
    if second == nil or first == 1 then
        error({err = 'ERR the owner argument must be "<owner id> <acquired_at> <record>"'})
    end
    return string.sub(owner, 1, second - 1), string.sub(owner, 1, first - 1),
        string.sub(owner, second + 1)
end

-- The owner argument as one JSON record (host, pid, thread, task, origin, acquired_at): what a
-- reader's entry keeps (rw_acquire.lua: readers keep a record each, in their owners' hash).
local function owner_json(owner)
    local tag, id, record = owner_parts(owner)
    return record .. string.sub(tag, #id + 2) .. '}'
end

-- Keep the owner key `id` alive for at least `ms` milliseconds more (its locks' expiry never
-- outlives it). Usually one PTTL: the key is written only when its time left is below `ms`,
-- and then for twice that, so an owner taking many locks rewrites it about once per lease
-- length, not on every acquire. `record` nil: only stretch an existing key (its record is
-- not known here).
local function keep_owner(id, record, ms)
    local key = owner_key(id)
    local left = redis.call('PTTL', key)
    if left >= ms then
        return
    end
    if record ~= nil then
        redis.call('SET', key, record, 'PX', string.format('%d', 2 * ms))
    elseif left ~= -2 then
        redis.call('PEXPIRE', key, string.format('%d', 2 * ms))
    end
end

-- Write the lock key for `token` with `owner` (the owner argument), expiring in `ttl` ms.
local function set_lock(key, token, owner, ttl)
    local tag, id, record = owner_parts(owner)
    redis.call('SET', key, token .. ' ' .. tag, 'PX', ttl)
    keep_owner(id, record, tonumber(ttl))
end

-- A lock key of ours was given `ms` more milliseconds: keep its owner key at least as long
-- (the id is read from the key's value; `owner`, the owner argument, supplies the record when
-- it names the same owner, else the existing owner key is only stretched).
local function keep_owner_of(key, owner, ms)
    local value = redis.call('GET', key)
    local first = string.find(value, ' ', 1, true)
    local second = first and string.find(value, ' ', first + 1, true)
    if second == nil then
        return
    end
    local id = string.sub(value, first + 1, second - 1)
    local record = nil
    if owner ~= nil and owner ~= '' then
        local _, given, text = owner_parts(owner)
        if given == id then
            record = text
        end
    end
    keep_owner(id, record, ms)
end

-- The owner record (JSON) of the lock key `key`, for holder.lua and listing.lua, or false when
-- the key is absent or not a lock (a user's string without an owner). An old-layout key (a
-- hash t/o) shows its stored owner, so operators still see who holds it during an upgrade.
-- `records`, when given, caches owner keys already read (id -> record or false).
local function owner_of(key, records)
    local value = redis.pcall('GET', key)
    if type(value) == 'table' then
        local old = redis.pcall('HGET', key, 'o')
        if type(old) == 'string' then
            return old
        end
        return false
    end
    if value == false then
        return false
    end
    local first = string.find(value, ' ', 1, true)
    local second = first and string.find(value, ' ', first + 1, true)
    if second == nil then
        return false
    end
    local id = string.sub(value, first + 1, second - 1)
    local acquired = string.sub(value, second + 1)
    local record = records and records[id]
    if record == nil then
        record = redis.pcall('GET', owner_key(id))
        if type(record) ~= 'string' then
            record = false
        end
        if records then
            records[id] = record
        end
    end
    if record == false then
        -- The owner key is gone (evicted, deleted by hand): say at least when.
        return '{"acquired_at":' .. acquired .. '}'
    end
    return record .. acquired .. '}'
end
