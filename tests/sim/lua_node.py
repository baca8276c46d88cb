"""A simulated Redis/Valkey node that runs the library's real Lua scripts (issue 26).

The keyspace is plain Python (strings, hashes, sorted sets; expiry in ms on the node's own
clock, checked lazily as Redis does), and each script runs atomically in one Lua 5.1
interpreter (``lupa.lua51``: the language version Redis embeds) with the ``redis.call`` /
``redis.pcall`` / ``redis.error_reply`` / ``redis.status_reply`` functions emulated for
exactly the commands the scripts use. The script text is what the library sends: the
``Script`` objects of ``wire/scripts.py`` and ``wire/primitives.py`` (their ``@include`` lines
already expanded), looked up by the SHA1 of the EVALSHA a command carries.

The server's identity is simulated too: ``INFO server`` gives the process's run_id and
uptime (on the node's clock), ``INFO replication`` its replication id and whether it was
promoted from a replica, ``INFO persistence`` whether the AOF is on, as
``scripts/node_identity.lua`` and ``scripts/node_rule.lua`` read them. Time inside one
script is frozen at its start (as Redis does for the expiry checks of a script).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from typing import Any

import lupa.lua51 as lua51

from django_redlock.wire import primitives, scripts
from django_redlock.wire.errors import NodeError

LUA_VERSION = "Lua 5.1 (lupa.lua51)"

# What the library's scripts are, by the SHA1 of their text (what an EVALSHA names).
LIBRARY_SCRIPTS: dict[bytes, scripts.Script] = {
    value.sha: value
    for module in (scripts, primitives)
    for value in vars(module).values()
    if isinstance(value, scripts.Script)
}

_PRELUDE = b"""
local dispatch = ...
local call_error = function(reply) error(reply.err, 0) end
redis = {}
redis.pcall = function(...) return dispatch(...) end
redis.call = function(...)
    local reply = dispatch(...)
    if type(reply) == 'table' and reply.err ~= nil then call_error(reply) end
    return reply
end
redis.error_reply = function(message) return {err = message} end
redis.status_reply = function(message) return {ok = message} end
redis.log = function() end
redis.LOG_WARNING = 3
redis.REPL_NONE, redis.REPL_AOF, redis.REPL_REPLICA, redis.REPL_ALL = 0, 1, 2, 3
redis.set_repl = function(mode) dispatch('\0SET_REPL', mode) end
local load = function(source, name)
    local chunk, problem = loadstring(source, name)
    if chunk == nil then error(problem, 0) end
    return chunk
end
-- Run a compiled script with KEYS and ARGV made from one call's arguments.
local invoke = function(chunk, count, ...)
    local all = {...}
    local keys, argv = {}, {}
    for i = 1, count do keys[i] = all[i] end
    for i = count + 1, #all do argv[i - count] = all[i] end
    KEYS, ARGV = keys, argv
    return chunk()
end
return load, invoke
"""


class Keyspace:
    """One node's data: key -> value (bytes: a string; ``Hash``; ``ZSet``) and key -> the ms
    (on the node's clock) after which it no longer exists."""

    __slots__ = ("data", "expires", "unreplicated")

    def __init__(self) -> None:
        self.data: dict[bytes, Any] = {}
        self.expires: dict[bytes, int] = {}
        # (key, hash field) written under redis.set_repl without REPL_REPLICA: in this
        # node's memory and AOF, never on its replicas (``replicated``).
        self.unreplicated: set[tuple[bytes, bytes]] = set()

    def copy(self) -> Keyspace:
        other = Keyspace()
        other.data = {k: v if type(v) is bytes else type(v)(v) for k, v in self.data.items()}
        other.expires = dict(self.expires)
        other.unreplicated = set(self.unreplicated)
        return other

    def replicated(self) -> Keyspace:
        """What a replica holds of this keyspace: a copy without the hash fields written
        only to this node's AOF."""
        other = self.copy()
        for key, field in other.unreplicated:
            value = other.data.get(key)
            if type(value) is Hash:
                value.pop(field, None)
                if not value:
                    del other.data[key]
                    other.expires.pop(key, None)
        other.unreplicated = set()
        return other

    def purge(self, now_ms: int) -> None:
        """Drop every key expired at ``now_ms`` (what a restart's load does)."""
        for key in [k for k, when in self.expires.items() if now_ms > when]:
            self.data.pop(key, None)
            del self.expires[key]


class Hash(dict[bytes, bytes]):
    __slots__ = ()


class ZSet(dict[bytes, float]):
    __slots__ = ()

    def ordered(self) -> list[tuple[bytes, float]]:
        return sorted(self.items(), key=lambda item: (item[1], item[0]))


def _text(value: object) -> bytes:
    """A redis.call argument as Redis reads it (Lua numbers as ``%.14g``)."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, bool):
        raise ValueError("Lua redis lib command arguments must be strings or integers")
    if isinstance(value, int):
        return b"%d" % value
    if isinstance(value, float):
        return (b"%.14g" % value) if not value.is_integer() or abs(value) >= 1e14 else b"%d" % value
    raise ValueError("Lua redis lib command arguments must be strings or integers")


def _score(value: float) -> bytes:
    return b"%d" % value if value.is_integer() else repr(value).encode()


class _Status:
    __slots__ = ("text",)

    def __init__(self, text: bytes) -> None:
        self.text = text


class _Error:
    __slots__ = ("text",)

    def __init__(self, text: bytes) -> None:
        self.text = text


WRONGTYPE = _Error(b"WRONGTYPE Operation against a key holding the wrong kind of value")


class Server:
    """What a script asks of its server besides the keyspace: a process (run_id, start) and
    its clock; set by ``SimNode`` before each script."""

    run_id: bytes = b"0" * 40
    replid: bytes = b"1" * 40  # master_replid2 once promoted (the replid it served before)
    promoted: bool = False  # a replica promoted in this process's life (second_repl_offset)
    started_ms: int = 0
    aof_enabled: bool = False

    @property
    def identity(self) -> bytes:
        """What ``scripts/node_identity.lua`` and a connection's hello make of this process."""
        if self.promoted:
            return self.run_id + b"/" + self.replid + b":1"
        return self.run_id + b"/" + b"0" * 40 + b":-1"


class LuaEngine:
    """One Lua 5.1 interpreter shared by every simulated node (scripts run one at a time:
    the simulation is single-threaded), with the scripts compiled once each.

    ``overrides``: script SHA1 -> replacement source, for the simulator's mutants (a broken
    variant of one script, run in place of the real one).
    """

    def __init__(self, overrides: dict[bytes, bytes] | None = None) -> None:
        self.lua = lua51.LuaRuntime(encoding=None, unpack_returned_tuples=True)
        self.loader: Callable[..., Any]
        self.invoke: Callable[..., Any]
        self.loader, self.invoke = self.lua.execute(_PRELUDE, self._dispatch)
        self.compiled: dict[bytes, Any] = {}
        self.overrides = overrides or {}
        self.space = Keyspace()
        self.server = Server()
        self.now_us = 0
        self.published: list[tuple[bytes, bytes]] = []
        self.to_replicas = True  # redis.set_repl: do this script's writes reach replicas?
        self._table = self.lua.table_from
        self.calls = 0
        self._commands: dict[bytes, Callable[[list[bytes]], Any]] = {
            b"DEL": self._del,
            b"EXISTS": self._exists,
            b"GET": self._get_string,
            b"HDEL": self._hdel,
            b"HGET": self._hget,
            b"HMGET": self._hmget,
            b"HSET": self._hset,
            b"INFO": self._info,
            b"\0SET_REPL": self._set_repl,
            b"PEXPIRE": self._pexpire,
            b"PTTL": self._pttl,
            b"PUBLISH": self._publish,
            b"SET": self._set,
            b"TIME": self._time,
            b"TYPE": self._type,
            b"ZADD": self._zadd,
            b"ZCARD": self._zcard,
            b"ZRANGE": self._zrange,
            b"ZRANGEBYSCORE": self._zrangebyscore,
            b"ZREM": self._zrem,
            b"ZSCORE": self._zscore,
        }

    # -- running a script ------------------------------------------------------------------

    def run(
        self,
        sha: bytes,
        keys: Sequence[bytes],
        args: Sequence[bytes],
        space: Keyspace,
        server: Server,
        now_us: int,
    ) -> object:
        """Run the script ``sha`` on ``space`` at ``now_us`` (the node's clock, µs): its reply
        as a client reads it (bytes, int, None, list; a status as bytes; an error reply as
        a ``NodeError``, as the transports report it)."""
        function = self.compiled.get(sha)
        if function is None:
            script = LIBRARY_SCRIPTS.get(sha)
            if script is None:
                return NodeError("NOSCRIPT No matching script. Please use EVAL.")
            source = self.overrides.get(sha, script.source)
            function = self.compiled[sha] = self.loader(source, b"@" + sha[:8])
        self.space, self.server, self.now_us = space, server, now_us
        self.published = []
        self.to_replicas = True
        try:
            result = self.invoke(function, len(keys), *keys, *args)
        except lua51.LuaError as error:
            text = error.args[0] if error.args else b"ERR script error"
            if isinstance(text, bytes):
                text = text.decode(errors="replace")
            return NodeError(str(text))
        return self._reply(result)

    def _reply(self, value: object) -> object:
        """A Lua value as the client reads the script's reply (Redis' conversion rules)."""
        if value is None or value is False:
            return None
        if value is True:
            return 1
        if isinstance(value, bytes):
            return value
        if isinstance(value, int | float):
            return int(value)
        if lua51.lua_type(value) == "table":
            table: Any = value
            err = table[b"err"]
            if err is not None:
                return NodeError(err.decode(errors="replace"))
            ok = table[b"ok"]
            if ok is not None:
                return ok
            out = []
            index = 1
            while True:
                item = table[index]
                if item is None:
                    break
                out.append(self._reply(item))
                index += 1
            return out
        return None

    def _lua(self, value: object) -> object:
        """A command's reply as a Lua value (Redis' conversion rules)."""
        kind = type(value)
        if kind is bytes or kind is int:  # the common replies, as they are
            return value
        if value is None:
            return False
        if isinstance(value, list):
            return self._table([self._lua(item) for item in value])
        if isinstance(value, _Status):
            return self._table({b"ok": value.text})
        if isinstance(value, _Error):
            return self._table({b"err": value.text})
        return value

    def _dispatch(self, name: object, *args: object) -> object:
        self.calls += 1
        try:
            # The hot path of every script (a Python call per redis.call): the command's name
            # as the scripts spell it, arguments that are bytes already, passed through.
            command = self._commands.get(name) or self._commands[_text(name).upper()]  # type: ignore[call-overload]
            return self._lua(command([a if type(a) is bytes else _text(a) for a in args]))
        except KeyError:
            return self._lua(_Error(b"ERR unknown command in the simulator: " + _text(name)))
        except ValueError as error:
            return self._lua(_Error(b"ERR " + str(error).encode()))

    # -- the keyspace ----------------------------------------------------------------------

    def _now_ms(self) -> int:
        return self.now_us // 1000

    def _get(self, key: bytes) -> Any:
        space = self.space
        when = space.expires.get(key)
        if when is not None and self._now_ms() > when:
            del space.expires[key]
            space.data.pop(key, None)
            return None
        return space.data.get(key)

    def _del(self, args: list[bytes]) -> Any:
        count = 0
        for key in args:
            if self._get(key) is not None:
                del self.space.data[key]
                self.space.expires.pop(key, None)
                count += 1
        return count

    def _exists(self, args: list[bytes]) -> Any:
        return sum(1 for key in args if self._get(key) is not None)

    def _hash(self, key: bytes) -> Hash | _Error | None:
        value = self._get(key)
        if value is not None and type(value) is not Hash:
            return WRONGTYPE
        return value

    def _hget(self, args: list[bytes]) -> Any:
        value = self._hash(args[0])
        if isinstance(value, _Error) or value is None:
            return value
        return value.get(args[1])

    def _hmget(self, args: list[bytes]) -> Any:
        value = self._hash(args[0])
        if isinstance(value, _Error):
            return value
        return [None if value is None else value.get(field) for field in args[1:]]

    def _hset(self, args: list[bytes]) -> Any:
        value = self._hash(args[0])
        if isinstance(value, _Error):
            return value
        if value is None:
            value = self.space.data[args[0]] = Hash()
        added = 0
        unreplicated = self.space.unreplicated
        for index in range(1, len(args) - 1, 2):
            added += args[index] not in value
            value[args[index]] = args[index + 1]
            if not self.to_replicas:
                unreplicated.add((args[0], args[index]))
            elif unreplicated:
                unreplicated.discard((args[0], args[index]))
        return added

    def _set_repl(self, args: list[bytes]) -> Any:
        """``redis.set_repl(mode)``: whether the script's next writes reach the replicas (the
        REPL_REPLICA bit; every mode here keeps them in the node's own AOF)."""
        self.to_replicas = bool(int(args[0]) & 2)
        return None

    def _hdel(self, args: list[bytes]) -> Any:
        value = self._hash(args[0])
        if isinstance(value, _Error) or value is None:
            return value or 0
        removed = sum(1 for field in args[1:] if value.pop(field, None) is not None)
        if not value:
            self._delete(args[0])
        return removed

    def _delete(self, key: bytes) -> None:
        self.space.data.pop(key, None)
        self.space.expires.pop(key, None)

    def _info(self, args: list[bytes]) -> Any:
        section = args[0].lower() if args else b"server"
        server = self.server
        if section == b"persistence":
            return b"# Persistence\r\naof_enabled:%d\r\n" % server.aof_enabled
        if section == b"replication":
            return (
                b"# Replication\r\nrole:master\r\nconnected_slaves:0\r\n"
                b"master_replid:%s\r\nmaster_replid2:%s\r\nsecond_repl_offset:%d\r\n"
                % (
                    b"f" * 40,
                    server.replid if server.promoted else b"0" * 40,
                    1 if server.promoted else -1,
                )
            )
        up = self._now_ms() // 1000 - server.started_ms // 1000
        return b"# Server\r\nredis_version:7.2.4\r\nrun_id:%s\r\nuptime_in_seconds:%d\r\n" % (
            server.run_id,
            max(0, up),
        )

    def _get_string(self, args: list[bytes]) -> Any:
        value = self._get(args[0])
        if value is not None and type(value) is not bytes:
            return WRONGTYPE
        return value

    def _set(self, args: list[bytes]) -> Any:
        """SET key value [PX ms | KEEPTTL] (the forms the scripts use)."""
        key, value = args[0], args[1]
        options = [arg.upper() for arg in args[2:]]
        existed = self._get(key) is not None
        when = self.space.expires.get(key) if existed else None
        if b"PX" in options:
            ms = int(args[2 + options.index(b"PX") + 1])
            if ms <= 0:
                return _Error(b"ERR invalid expire time in 'set' command")
            when = self._now_ms() + ms
        elif b"KEEPTTL" not in options:
            when = None
        elif set(options) - {b"KEEPTTL"}:
            return _Error(b"ERR syntax error")
        self.space.data[key] = value
        if when is None:
            self.space.expires.pop(key, None)
        else:
            self.space.expires[key] = when
        return _Status(b"OK")

    def _pexpire(self, args: list[bytes]) -> Any:
        key = args[0]
        if self._get(key) is None:
            return 0
        ms = int(args[1])
        if ms <= 0:
            self._delete(key)
        else:
            self.space.expires[key] = self._now_ms() + ms
        return 1

    def _pttl(self, args: list[bytes]) -> Any:
        key = args[0]
        if self._get(key) is None:
            return -2
        when = self.space.expires.get(key)
        return -1 if when is None else when - self._now_ms()

    def _publish(self, args: list[bytes]) -> Any:
        self.published.append((args[0], args[1]))
        return 0

    def _time(self, args: list[bytes]) -> Any:
        return [b"%d" % (self.now_us // 1_000_000), b"%d" % (self.now_us % 1_000_000)]

    def _type(self, args: list[bytes]) -> Any:
        value = self._get(args[0])
        kinds: dict[type, bytes] = {bytes: b"string", Hash: b"hash", ZSet: b"zset"}
        kind = kinds.get(type(value), b"none")
        return _Status(kind)

    def _zset(self, key: bytes) -> ZSet | _Error | None:
        value = self._get(key)
        if value is not None and type(value) is not ZSet:
            return WRONGTYPE
        return value

    def _zadd(self, args: list[bytes]) -> Any:
        key, rest = args[0], args[1:]
        flags = set()
        while rest and rest[0].upper() in (b"NX", b"XX", b"GT", b"LT", b"CH"):
            flags.add(rest[0].upper())
            rest = rest[1:]
        if flags - {b"NX", b"XX"}:
            return _Error(b"ERR the simulator's ZADD takes only NX and XX")
        nx, xx = b"NX" in flags, b"XX" in flags
        value = self._zset(key)
        if isinstance(value, _Error):
            return value
        if value is None:
            if xx:
                return 0
            value = self.space.data[key] = ZSet()
        added = 0
        for index in range(0, len(rest) - 1, 2):
            score, member = float(rest[index]), rest[index + 1]
            if member in value:
                if not nx:
                    value[member] = score
            elif not xx:
                value[member] = score
                added += 1
        return added

    def _zcard(self, args: list[bytes]) -> Any:
        value = self._zset(args[0])
        if isinstance(value, _Error):
            return value
        return 0 if value is None else len(value)

    def _zrange(self, args: list[bytes]) -> Any:
        value = self._zset(args[0])
        if isinstance(value, _Error):
            return value
        if value is None:
            return []
        items = value.ordered()
        start, stop = int(args[1]), int(args[2])
        size = len(items)
        start = max(0, start + size if start < 0 else start)
        stop = stop + size if stop < 0 else min(stop, size - 1)
        chosen = items[start : stop + 1] if start <= stop else []
        if len(args) > 3 and args[3].upper() == b"WITHSCORES":
            return [part for member, score in chosen for part in (member, _score(score))]
        return [member for member, _ in chosen]

    def _zrangebyscore(self, args: list[bytes]) -> Any:
        value = self._zset(args[0])
        if isinstance(value, _Error):
            return value
        if value is None:
            return []
        low, high = _bound(args[1]), _bound(args[2])
        items = value.ordered()
        scores = [score for _, score in items]
        lo = (
            bisect.bisect_left(scores, low[0])
            if not low[1]
            else bisect.bisect_right(scores, low[0])
        )
        chosen = [
            (member, score)
            for member, score in items[lo:]
            if score < high[0] or (score == high[0] and not high[1])
        ]
        rest = [arg.upper() for arg in args[3:]]
        if b"LIMIT" in rest:
            at = rest.index(b"LIMIT")
            offset, count = int(args[3 + at + 1]), int(args[3 + at + 2])
            chosen = chosen[offset:] if count < 0 else chosen[offset : offset + count]
        if b"WITHSCORES" in rest:
            return [part for member, score in chosen for part in (member, _score(score))]
        return [member for member, _ in chosen]

    def _zrem(self, args: list[bytes]) -> Any:
        value = self._zset(args[0])
        if isinstance(value, _Error) or value is None:
            return value or 0
        removed = sum(1 for member in args[1:] if value.pop(member, None) is not None)
        if not value:
            self._delete(args[0])
        return removed

    def _zscore(self, args: list[bytes]) -> Any:
        value = self._zset(args[0])
        if isinstance(value, _Error) or value is None:
            return value
        score = value.get(args[1])
        return None if score is None else _score(score)


def _bound(text: bytes) -> tuple[float, bool]:
    """A ZRANGEBYSCORE bound: (score, exclusive)."""
    exclusive = text.startswith(b"(")
    body = text[1:] if exclusive else text
    if body in (b"-inf", b"+inf", b"inf"):
        return (float(body.replace(b"+", b"")), exclusive)
    return (float(body), exclusive)
