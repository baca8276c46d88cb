-- Included after lock_key.lua by the scripts that write lock keys: the key and its owner key,
-- as lock_key.lua lays them out.

-- The owner argument's tag, owner id and record; raises on a malformed one (a caller's bug).
local function owner_parts(owner)
    local space = string.find(owner, ' ', 1, true)
    if space == nil or space < 9 then
        error({err = 'ERR the owner argument must be "<owner id><acquired_at> <record>"'})
    end
    return string.sub(owner, 1, space - 1), string.sub(owner, 1, 7), string.sub(owner, space + 1)
end

-- Keep the owner key `id` alive `ms` milliseconds more at least. Usually one PTTL: it is
-- written only when its time left is below `ms`, then for twice that, so an owner taking many
-- locks rewrites it about once per lease length. `record` nil: only stretch an existing key.
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

-- A lock key of ours now lives `ms` more: so does its owner key (the id is the key's; `owner`
-- gives the record when it names the same owner, else the owner key is only stretched).
local function keep_owner_of(key, owner, ms)
    local value = redis.call('GET', key)
    local id = string.sub(value, string.find(value, ' ', 1, true) + 1)
    id = string.sub(id, 1, 7)
    local record = nil
    if owner ~= nil and owner ~= '' then
        local _, given, text = owner_parts(owner)
        if given == id then
            record = text
        end
    end
    keep_owner(id, record, ms)
end

-- The owner argument as one JSON record (host, pid, thread, task, origin, acquired_at): what
-- a reader's entry keeps (readers keep a record each, in their owners' hash: rw_acquire.lua).
local function owner_json(owner)
    local tag, _, record = owner_parts(owner)
    return record .. acquired_at(tag) .. '}'
end
