-- Included after lock_key.lua by the scripts that show who holds a lock (holder.lua,
-- listing.lua): the owner record of a lock key, as lock_key.lua lays it out.

-- acquired_at of a tag, in seconds as the owner record's JSON has it (to the ms).
local function acquired_at(tag)
    return string.format('%.3f', (tonumber(string.sub(tag, 8), 36) or 0) / 1000)
end

-- The owner record (JSON) of the lock key `key`, for holder.lua and listing.lua, or false when
-- the key is absent or not a lock. An old-layout key (a hash t/o) shows its stored owner, so
-- operators still see who holds it during an upgrade. `records`, when given, caches the owner
-- keys already read (id -> record or false).
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
    local space = string.find(value, ' ', 1, true)
    if space == nil or #value < space + 8 then
        return false
    end
    local tag = string.sub(value, space + 1)
    local id = string.sub(tag, 1, 7)
    local record = records and records[id]
    if record == nil then
        record = redis.pcall('GET', '\0o:' .. id .. ':django_redlock:node')
        if type(record) ~= 'string' then
            record = false
        end
        if records then
            records[id] = record
        end
    end
    if record == false then
        -- The owner key is gone (deleted by hand, evicted): say at least when.
        return '{"acquired_at":' .. acquired_at(tag) .. '}'
    end
    return record .. acquired_at(tag) .. '}'
end
