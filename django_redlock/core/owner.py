"""Who owns a lease: the owner record stored with a lock, its description in messages, and
the scope used for re-entry.

The record (JSON: host, pid, thread, task, origin, acquired_at) tells operators where a lock
was taken; it never holds the token. The scripts receive it as ``"<owner id><acquired_at>
<record up to acquired_at>"`` (:meth:`OwnerRecords.record`): each lock key keeps only the id
and the time, and the record is stored once per owner on each node (``scripts/lock_key.lua``),
so a held lock costs a node about as much as a plain string lock. The scope (pid, thread,
asyncio task) says who may re-enter a lease it holds: another thread, task or a forked child
never can.
"""

from __future__ import annotations

import base64
import hashlib
import json
import sys
import threading
import time
import weakref
from datetime import UTC, datetime
from typing import Any, Protocol

from django_redlock.exceptions import RedlockError
from django_redlock.procedures.arguments import MAX_ORIGIN_BYTES, clip_origin, clip_text
from django_redlock.wire import process
from django_redlock.wire.process import current_pid

__all__ = [
    "MAX_OWNER_BYTES",
    "HolderSource",
    "OwnerRecords",
    "base36",
    "current_task_name",
    "describe_holder",
    "owner_id",
    "owner_scope",
]

MAX_OWNER_BYTES = 4096
"""Longest owner record stored for a lock (its JSON, in bytes): host, pid, thread and task
names, origin and time. Text fields are cut further when escapes make it longer."""

OWNER_ID_CHARS = 7
"""Length of an owner id (URL-safe base64, so never a space: the scripts split on spaces).
Equal records share one id, hence one owner key on each node."""

# Byte budgets of the owner record's names (thread, task, host) before JSON escaping.
_MAX_NAME_BYTES = 256
# Prefixes kept per manager before the cache starts afresh (bounds memory, not speed).
_CACHE_SIZE = 1024


class OwnerRecords:
    """Builds owner records for one manager (host name fixed at creation).

    Each record comes from a cached prefix per (pid, thread, task, origin): ``json.dumps`` on
    every acquire would cost more than a loopback round trip on a small VM.
    """

    def __init__(self, host: str) -> None:
        self.host = host
        # (pid, thread, task, origin) -> (owner id, record JSON up to acquired_at)
        self._cache: dict[tuple[object, ...], tuple[str, str]] = {}
        # The last acquire's time in ms // 1296 and its base-36 text (the time's base-36
        # text less its last two digits): acquires within the same 1.296 s (any thread)
        # share it. One tuple, replaced whole, so a thread never reads one time's text with
        # another's number.
        self._last_ms: tuple[int, str] = (-1, "")

    def record(self, origin: str | None) -> str:
        """The owner argument of an acquire made now by this thread (and task) for ``origin``,
        as the scripts take it (``scripts/lock_key.lua``): ``"<tag> <record>"``, the tag being
        the owner id (:func:`owner_id`) then ``acquired_at`` in milliseconds since the epoch in
        base 36, the record the owner's JSON up to its ``acquired_at`` value."""
        thread = threading.current_thread()
        # current_task_name(), written out: one call less on every acquire.
        asyncio = sys.modules.get("asyncio")
        task = None
        if asyncio is not None and asyncio.events._get_running_loop() is not None:
            running = asyncio.current_task()
            if running is not None:
                task = running.get_name()
        if origin is not None:  # None, the usual origin, needs no clipping
            origin = clip_origin(origin)  # also bounds the cache's keys
        pid = process.PID
        key = (pid, threading.get_ident(), thread.name, task, origin)
        prefix = self._cache.get(key)
        if prefix is None:
            record = owner_prefix(self.host, pid, thread.name, task, origin)
            if len(self._cache) > _CACHE_SIZE:
                self._cache.clear()
            prefix = self._cache[key] = (owner_id(record), f" {record}")
        # base36(now_ms), without a call while the time's upper digits stay those of the
        # last acquire (about 1.3 s: the last two digits are one lookup).
        high, low = divmod(int(time.time() * 1000), 1296)
        last = self._last_ms
        if last[0] == high:
            stamp = last[1] + _PAIRS[low]
        else:
            stamp = base36(high * 1296 + low)
            if high < _MAX_HIGH:  # 8 digits: the upper 6 are the stamp less its last 2
                self._last_ms = (high, stamp[:-2])
        return f"{prefix[0]}{stamp}{prefix[1]}"


_DIGITS = "0123456789abcdefghijklmnopqrstuvwxyz"
# Every two-digit base-36 number: a time in ms is 4 lookups (a digit loop took 3 us more per
# acquire than the decimal time it replaced, on a small VM).
_PAIRS = [high + low for high in _DIGITS for low in _DIGITS]
# Times in ms // 1296 below which base36(time in ms) is 8 digits, the last two those of the
# time % 1296: until 2059 (after, base36 runs its digit loop every time).
_MAX_HIGH = 1296**3


def base36(number: int) -> str:
    """``number`` (>= 0) in base 36, lowercase, what Lua's ``tonumber(text, 36)`` reads: 8
    digits for a time in ms from 1972 until 2059 (leading zeros kept below 36^6), more after."""
    rest, first = divmod(number, 1296)
    rest, second = divmod(rest, 1296)
    rest, third = divmod(rest, 1296)
    if rest < 1296:
        return f"{_PAIRS[rest]}{_PAIRS[third]}{_PAIRS[second]}{_PAIRS[first]}"
    digits = []
    while number:
        number, digit = divmod(number, 36)
        digits.append(_DIGITS[digit])
    return "".join(reversed(digits))


def owner_id(prefix: str) -> str:
    """The id naming an owner record (``prefix``: its JSON up to ``acquired_at``) on the nodes:
    :data:`OWNER_ID_CHARS` characters of ``[A-Za-z0-9_-]`` (42 bits of a BLAKE2b digest).
    Short because each lock key carries it: with the token and the time, a lock key's value
    stays within 56 bytes, a size class below (see ``scripts/lock_key.lua``). Two owners that
    differ share an id (and one's record would be shown for the other's locks; nothing else
    depends on it) with a chance of about 1 in 10^5 with 10,000 owners holding locks at once."""
    digest = hashlib.blake2b(prefix.encode(), digest_size=6).digest()
    return base64.urlsafe_b64encode(digest).decode()[:OWNER_ID_CHARS]


def owner_prefix(host: str, pid: int, thread: str, task: str | None, origin: str | None) -> str:
    """The owner record's JSON up to its ``acquired_at`` value, at most
    :data:`MAX_OWNER_BYTES` long once the time is appended.

    The text fields are cut to their budgets; JSON escapes (``\\uXXXX`` for non-ASCII and
    control characters) can still make the record longer, so the budgets are halved until it
    fits. ASCII throughout (``ensure_ascii``): the hot-path encoder of the acquire needs it.
    """
    names, origin_budget = _MAX_NAME_BYTES, MAX_ORIGIN_BYTES
    while True:
        body = json.dumps(
            {
                "host": clip_text(host, names),
                "pid": pid,
                "thread": clip_text(thread, names),
                "task": None if task is None else clip_text(task, names),
                "origin": None if origin is None else clip_text(origin, origin_budget),
            },
            separators=(",", ":"),
        )
        prefix = body[:-1] + ',"acquired_at":'
        # The time appended is at most 18 characters (10 digits, a point, 6 digits, "}").
        if len(prefix) + 18 <= MAX_OWNER_BYTES or (names <= 8 and origin_budget <= 8):
            return prefix
        names, origin_budget = max(8, names // 2), max(8, origin_budget // 2)


# A thread's scope, one tuple per thread rather than one per lease (every held lease keeps
# its scope, and the garbage collector visits each object a lease refers to).
_THREAD_SCOPES: dict[int, tuple[object, ...]] = {}


def owner_scope() -> tuple[object, ...]:
    """Who owns a lease taken here: (pid, thread id, a weak reference to the asyncio task, or
    None outside a task)."""
    asyncio = sys.modules.get("asyncio")
    if asyncio is not None and asyncio.events._get_running_loop() is not None:
        task = asyncio.current_task()
        if task is not None:
            # The task itself (not its id, which a later task may reuse), held weakly: a
            # lease keeps its scope, and a task's frame may keep the lease, so a strong
            # reference would make a cycle through every lease a task holds, which the
            # collector could not see once the lease is untracked (core.lease's
            # _cycle_free). CPython hands out one weak reference per task (no callback),
            # which compares and hashes as the task while it lives: the task's scopes are
            # equal, and the same object.
            try:
                ref = weakref.ref(task)
            except TypeError:  # a task object that cannot be weakly referenced: held
                return (current_pid(), threading.get_ident(), task)
            # Hashed now, while the task lives: a weak reference keeps the hash it once
            # computed, and cannot compute one once its task is gone. A lease of a kind the
            # registry does not hold (a semaphore slot, a read lease) keeps its scope unhashed
            # until its release forgets it, which may run after its task is gone (a slot
            # taken in a task of its own, under asyncio.wait_for or gather).
            hash(ref)
            return (current_pid(), threading.get_ident(), ref)
    ident = threading.get_ident()
    scope = _THREAD_SCOPES.get(ident)
    if scope is None or scope[0] != process.PID:  # a new thread, or a forked child
        if len(_THREAD_SCOPES) >= _CACHE_SIZE:
            _THREAD_SCOPES.clear()
        scope = _THREAD_SCOPES[ident] = (current_pid(), ident, None)
    return scope


def current_task_name() -> str | None:
    """The running asyncio task's name, or None outside a task (cheap when no loop runs)."""
    asyncio = sys.modules.get("asyncio")
    if asyncio is None or asyncio.events._get_running_loop() is None:
        return None
    task = asyncio.current_task()
    return None if task is None else task.get_name()


class HolderSource(Protocol):
    """What :func:`describe_holder` reads: a manager's ``holder(name)``."""

    def holder(self, name: str) -> dict[str, Any] | None: ...


def describe_holder(manager: HolderSource, name: str) -> str:
    """Who holds ``name``, for a message: ``held by <host> pid <pid> (<origin>) since <UTC
    time>, N s left on its lease``. Never raises: an owner that cannot be read is said so."""
    try:
        owner = manager.holder(name)
    except (RedlockError, OSError) as error:
        return f"held by another holder (its owner could not be read: {error})"
    if owner is None:
        return "held by another holder (its owner could not be read)"
    since = owner.get("acquired_at")
    when = (
        datetime.fromtimestamp(since, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        if isinstance(since, int | float)
        else "an unknown time"
    )
    return (
        f"held by {owner.get('host', '?')} pid {owner.get('pid', '?')} "
        f"({owner.get('origin') or 'unknown origin'}) since {when}, "
        f"{owner.get('ttl', 0):.0f} s left on its lease"
    )
