-- Included after lock_key.lua by the scripts that write lock keys: the key and its owner key,
-- as lock_key.lua lays them out. The owner argument is '<tag> <record>'; the tag starts with
-- the 7-character owner id.

-- Keep the owner key of `id` alive `ms` milliseconds more at least. Usually one PTTL: it is
-- written only when its time left is below `ms`, then for twice that, so an owner taking many
-- locks rewrites it about once per lease length. `owner` (the owner argument, naming this id)
-- gives the record; nil only stretches an existing owner key.
local function keep_owner(id, owner, ms)
    local key = '\0o:' .. id .. ':django_redlock:node'
    local left = redis.call('PTTL', key)
    if left >= ms then
        return
    end
    if owner ~= nil then
        local record = string.sub(owner, string.find(owner, ' ', 1, true) + 1)
        redis.call('SET', key, record, 'PX', string.format('%d', 2 * ms))
    elseif left ~= -2 then
        redis.call('PEXPIRE', key, string.format('%d', 2 * ms))
    end
end

-- Write the lock key for `token` with `owner` (the owner argument), expiring in `ttl` ms.
-- Raises on a malformed owner argument (a caller's bug), before the key is written.
local function set_lock(key, token, owner, ttl)
    local space = string.find(owner, ' ', 9, true)
    if space == nil then
        error({err = 'ERR the owner argument must be "<owner id><acquired_at> <record>"'})
    end
    redis.call('SET', key, token .. ' ' .. string.sub(owner, 1, space - 1), 'PX', ttl)
    keep_owner(string.sub(owner, 1, 7), owner, tonumber(ttl))
end

-- A lock key of ours now lives `ms` more: so does its owner key (the id is the key's; `owner`
-- gives the record when it names the same owner, else the owner key is only stretched).
-- Called after the lock key's own write: a node out of memory refuses a script's first write
-- that needs memory, not the ones after it, so a renewal never fails for the owner's record.
local function keep_owner_of(key, owner, ms)
    local value = redis.call('GET', key)
    local space = string.find(value, ' ', 1, true)
    local id = string.sub(value, space + 1, space + 7)
    if owner == nil or string.sub(owner, 1, 7) ~= id or string.find(owner, ' ', 9, true) == nil then
        owner = nil
    end
    keep_owner(id, owner, ms)
end
