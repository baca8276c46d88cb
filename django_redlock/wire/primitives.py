"""The node side of the primitives beyond a mutex: semaphores, read-write locks, multi-locks
and hand-off. Script loaders and command builders only: plain functions, no I/O.

Each granting script ends with the connection's identity (run_id, persistence), appended per
node by the transport when the command is posted with ``identify=True``, exactly as
``acquire_command``'s (see ``scripts/vote_gate.lua``); their EVAL fallbacks name no process
(empty strings), so the node then checks itself by ``scripts/node_rule.lua``.

Key shapes on every node (``key`` is the manager's prefix plus the name; the NUL byte keeps
them apart from every lock key, since names cannot contain control characters):

- a lock key (a lock, a write lease, a slot) is a string ``"<token> <owner id><acquired_at>"``
  with the owner record in one key per owner (``scripts/lock_key.lua``);
- semaphore: slot ``i`` is the lock key ``key + "\\x00s" + str(i)``, its
  line and lapse times ``key + "\\x00s\\x00q"`` / ``key + "\\x00s\\x00e"``; waiters are woken on
  ``key + "\\x00s" + "\\x00w" + listener``;
- read-write lock: the writer is the lock key ``key`` itself (a writer reads as a lock), the readers
  ``key + "\\x00r"`` (token -> expiry ms), their owners ``key + "\\x00o"``; the line is the
  lock's (``key + "\\x00q"``, ``key + "\\x00e"``) with members ``"r|<waiter>"``/``"w|<waiter>"``;
- multi-lock: the lock keys of its names, the very keys of single locks;
- hand-off: rewrites the token of existing lock-shaped keys, keeping their expiry.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import partial
from typing import Literal

from django_redlock.wire.scripts import (
    HOT_SCRIPTS,
    LAPSE,
    LINE,
    NODE_KEY,
    READERS,
    Command,
    Fallback,
    Script,
    extend_command,
    load_script,
    owns_command,
)

__all__ = [
    "ACQUIRE_MANY",
    "EXTEND_MANY",
    "HANDOFF",
    "HANDOFF_REFUSED",
    "MAX_MANY",
    "MAX_SEMAPHORE_LIMIT",
    "OWNS_MANY",
    "PRELOAD",
    "PRIMITIVE_SCRIPTS",
    "READERS",
    "READER_OWNERS",
    "RELEASE_MANY",
    "RW_ACQUIRE",
    "RW_EXTEND",
    "RW_OWNS",
    "RW_RELEASE",
    "SEMAPHORE",
    "SEMAPHORE_ACQUIRE",
    "SEMAPHORE_RELEASE",
    "Mode",
    "acquire_many_command",
    "check_limit",
    "check_mode",
    "extend_many_command",
    "handback_command",
    "handoff_command",
    "many_keys",
    "owns_many_command",
    "quorum_slot",
    "release_many_command",
    "rw_acquire_command",
    "rw_extend_command",
    "rw_leave_command",
    "rw_owns_command",
    "rw_release_command",
    "semaphore_acquire_command",
    "semaphore_base",
    "semaphore_extend_command",
    "semaphore_leave_command",
    "semaphore_owns_command",
    "semaphore_release_command",
    "slot_granted",
    "slot_key",
    "slot_keys",
]

SEMAPHORE_ACQUIRE = load_script("semaphore_acquire")
SEMAPHORE_RELEASE = load_script("semaphore_release")
RW_ACQUIRE = load_script("rw_acquire")
RW_RELEASE = load_script("rw_release")
RW_EXTEND = load_script("rw_extend")
RW_OWNS = load_script("rw_owns")
ACQUIRE_MANY = load_script("acquire_many")
RELEASE_MANY = load_script("release_many")
EXTEND_MANY = load_script("extend_many")
OWNS_MANY = load_script("owns_many")
HANDOFF = load_script("handoff")

PRIMITIVE_SCRIPTS = (
    SEMAPHORE_ACQUIRE,
    SEMAPHORE_RELEASE,
    RW_ACQUIRE,
    RW_RELEASE,
    RW_EXTEND,
    RW_OWNS,
    ACQUIRE_MANY,
    RELEASE_MANY,
    EXTEND_MANY,
    OWNS_MANY,
    HANDOFF,
)
"""Every script of this module."""

PRELOAD = (*HOT_SCRIPTS, *PRIMITIVE_SCRIPTS)
"""Every script a manager sends for a lease, loaded with SCRIPT LOAD on each new connection
before anything else, so that the first command of no lease, whatever its kind, meets
NOSCRIPT. A NOSCRIPT's EVAL goes out only when the sender reads that reply: a release returns
at a quorum, so the first release of a semaphore, a read-write lock or a multi-lock reached a
node that answered late only at this thread's next operation, and an idle process left the
lock held there for its whole ttl. About 0.5 ms of a node's time per new connection (11 more
loads)."""
for _script in PRIMITIVE_SCRIPTS:
    _script.preloaded = True

SEMAPHORE = "\x00s"
"""Appended to a semaphore's key: the base of its slots (``base + str(i)``) and its line."""
READER_OWNERS = "\x00o"
"""Appended to a read-write lock's key: its readers' owners (hash token -> owner JSON)."""

MAX_SEMAPHORE_LIMIT = 1024
"""The largest semaphore ``limit``: every acquire names all its slots (one key each)."""
MAX_MANY = 1024
"""The most names one multi-lock may take at once (four keys each per acquire try)."""

HANDOFF_REFUSED = -2
"""``handoff.lua``'s answer when a node no longer holds the old token."""

Mode = Literal["r", "w"]
"""The side of a read-write lock a lease holds: ``"r"`` (read, shared) or ``"w"`` (write)."""
_IDENTITY_UNKNOWN = ("", "")  # the EVAL fallback names no process: the node checks itself


def _granting(script: Script, keys: Sequence[str], args: Sequence[str | int]) -> Command:
    """A command of a granting script: EVALSHA counting the two identity arguments the
    transport appends (``identify=True``), and an EVAL fallback that is never sent once the
    operation is over (a late grant would take a key nobody releases)."""
    fallback = Fallback(partial(script.eval, keys, args, trailing=2), False, identify=True)
    return (script.evalsha(keys, args, trailing=2), fallback)


# -- semaphores --------------------------------------------------------------------------


def check_limit(limit: object) -> int:
    """``limit`` as a semaphore's slot count.

    Raises:
        TypeError: not an int (a bool is refused too).
        ValueError: below 1 or above :data:`MAX_SEMAPHORE_LIMIT`.
    """
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise TypeError(f"limit must be an int, not {type(limit).__name__}")
    if not 1 <= limit <= MAX_SEMAPHORE_LIMIT:
        raise ValueError(f"limit must be between 1 and {MAX_SEMAPHORE_LIMIT}, not {limit}")
    return limit


def semaphore_base(key: str) -> str:
    """The base of the semaphore keyed ``key``: its slots and its line hang off it."""
    return key + SEMAPHORE


def slot_key(key: str, slot: int) -> str:
    """The key of slot ``slot`` (0-based) of the semaphore keyed ``key``."""
    return f"{key}{SEMAPHORE}{slot}"


def slot_keys(key: str, limit: int) -> list[str]:
    """Every slot key of the semaphore keyed ``key``, in slot order."""
    return [slot_key(key, slot) for slot in range(check_limit(limit))]


def _semaphore_line(key: str) -> tuple[str, str]:
    base = semaphore_base(key)
    return base + LINE, base + LAPSE


def semaphore_acquire_command(
    key: str,
    limit: int,
    token: str,
    ttl_ms: int,
    owner: str,
    quarantine_ms: int,
    waiter: str = "",
    ticket: int = 0,
    lifetime_ms: int = 0,
    prefer: int = -1,
) -> Command:
    """Take a slot of the semaphore keyed ``key`` with ``limit`` slots
    (``scripts/semaphore_acquire.lua``); post it with ``identify=True``. The reply is
    ``[1, slot]`` (granted) or ``[0, ms]`` (refused): see :func:`slot_granted`.

    Raises:
        TypeError, ValueError: a bad ``limit``.
    """
    line, lapse = _semaphore_line(key)
    keys = (NODE_KEY, line, lapse, *slot_keys(key, limit))
    args = (token, ttl_ms, owner, quarantine_ms, waiter, ticket, lifetime_ms, prefer)
    return _granting(SEMAPHORE_ACQUIRE, keys, args)


def semaphore_release_command(key: str, limit: int, token: str, waiter: str = "") -> Command:
    """Free whichever slot ``token`` holds on a node (the quorum's slot, or a stray grant of
    another slot) and drop ``waiter``'s place. Idempotent: its EVAL fallback is sent even
    after the operation is over. Reply: 1 when a slot was freed, else 0."""
    line, lapse = _semaphore_line(key)
    return SEMAPHORE_RELEASE.command(
        (line, lapse, *slot_keys(key, limit)), (token, waiter), fallback_when_over=True
    )


def semaphore_yield_command(
    key: str, limit: int, token: str, waiter: str, ticket: int, lifetime_ms: int
) -> Command:
    """The clean-up of a failed round of a blocking acquire that goes on waiting: free the
    slot ``token`` took on a node and put ``waiter``'s place back under ``ticket``, for
    ``lifetime_ms`` (``scripts/semaphore_release.lua``). Reply: 1 when a slot was freed."""
    line, lapse = _semaphore_line(key)
    return SEMAPHORE_RELEASE.command(
        (line, lapse, *slot_keys(key, limit)),
        (token, waiter, ticket, lifetime_ms),
        fallback_when_over=True,
    )


def semaphore_leave_command(key: str, limit: int, waiter: str) -> Command:
    """Drop ``waiter``'s place in the semaphore's line (a blocking acquire that gave up)."""
    return semaphore_release_command(key, limit, "", waiter)


def semaphore_extend_command(key: str, slot: int, token: str, ttl_ms: int, owner: str) -> Command:
    """Renew the lease on slot ``slot`` (or re-create it where a node lost it): a slot is a
    lock, so this is ``extend.lua``."""
    return extend_command(slot_key(key, slot), token, ttl_ms, owner)


def semaphore_owns_command(key: str, slot: int, token: str) -> Command:
    """Does a node still hold slot ``slot`` for ``token`` (``owns.lua``)."""
    return owns_command(slot_key(key, slot), token)


def slot_granted(reply: object) -> int | None:
    """The slot a node granted by its ``semaphore_acquire.lua`` reply, or None when it
    refused (or answered anything else: an error, a timeout)."""
    if isinstance(reply, list) and len(reply) == 2 and reply[0] == 1:
        slot = reply[1]
        return slot if isinstance(slot, int) else None
    return None


def quorum_slot(replies: Iterable[object], quorum: int) -> int | None:
    """The slot that at least ``quorum`` nodes granted, or None. Nodes whose states differ
    may grant different slots; only a slot granted by a quorum is held (each slot is a
    Redlock mutex of its own), and the grants of the other nodes must be released."""
    counts: dict[int, int] = {}
    for reply in replies:
        slot = slot_granted(reply)
        if slot is not None:
            counts[slot] = counts.get(slot, 0) + 1
            if counts[slot] >= quorum:
                return slot
    return None


# -- read-write locks --------------------------------------------------------------------


def check_mode(mode: object) -> Mode:
    """``mode`` as the side of a read-write lock a lease holds: ``"r"`` (read) or ``"w"`` (write).

    Raises:
        TypeError: not a str.
        ValueError: another string.
    """
    if not isinstance(mode, str):
        raise TypeError(f"mode must be 'r' or 'w', not {type(mode).__name__}")
    if mode == "r":
        return "r"
    if mode == "w":
        return "w"
    raise ValueError(f"mode must be 'r' or 'w', not {mode!r}")


def _rw_keys(key: str) -> tuple[str, str, str, str, str]:
    return (key, key + READERS, key + READER_OWNERS, key + LINE, key + LAPSE)


def rw_acquire_command(
    key: str,
    mode: Mode,
    token: str,
    ttl_ms: int,
    owner: str,
    quarantine_ms: int,
    waiter: str = "",
    ticket: int = 0,
    lifetime_ms: int = 0,
) -> Command:
    """Take a read (``"r"``) or write (``"w"``) lease of the read-write lock keyed ``key``
    (``scripts/rw_acquire.lua``); post it with ``identify=True``. Reply: ``OK`` when
    granted, else the ms until what blocks it runs out (0: waiters ahead).

    Raises:
        TypeError, ValueError: a bad ``mode``.
    """
    keys = (*_rw_keys(key), NODE_KEY)
    args = (check_mode(mode), token, ttl_ms, owner, quarantine_ms, waiter, ticket, lifetime_ms)
    return _granting(RW_ACQUIRE, keys, args)


def rw_release_command(key: str, mode: Mode, token: str, waiter: str = "") -> Command:
    """Release a read or write lease and drop ``waiter``'s place; wakes who may now take the
    lock. Idempotent: its EVAL fallback is sent even after the operation is over."""
    return RW_RELEASE.command(
        _rw_keys(key), (check_mode(mode), token, waiter), fallback_when_over=True
    )


def rw_leave_command(key: str, mode: Mode, waiter: str) -> Command:
    """Drop ``waiter``'s place (of mode ``mode``) in the read-write lock's line."""
    return rw_release_command(key, mode, "", waiter)


def rw_extend_command(key: str, mode: Mode, token: str, ttl_ms: int, owner: str) -> Command:
    """Renew a read or write lease to ``ttl_ms`` from now, or re-create it where a node lost
    it (``scripts/rw_extend.lua``). Reply: 1 renewed, 2 re-created, -1 another holder has it
    here."""
    keys = (key, key + READERS, key + READER_OWNERS)
    args = (check_mode(mode), token, ttl_ms, owner)
    return (RW_EXTEND.evalsha(keys, args), Fallback(partial(RW_EXTEND.eval, keys, args), False))


def rw_owns_command(key: str, mode: Mode, token: str) -> Command:
    """Does a node still hold this read or write lease. Reply: 1 or 0."""
    return RW_OWNS.command((key, key + READERS), (check_mode(mode), token))


# -- multi-locks -------------------------------------------------------------------------


def many_keys(keys: Iterable[str]) -> list[str]:
    """``keys`` sorted, each once: the one order in which every client names them (the
    scripts need it for the same answer everywhere; sorting costs nothing and rules out any
    order-dependent behaviour).

    Raises:
        TypeError: ``keys`` is a single str, or holds something else than str.
        ValueError: no key, or more than :data:`MAX_MANY`.
    """
    if isinstance(keys, str):
        raise TypeError("names must be an iterable of names, not a single str")
    found = set()
    for key in keys:
        if not isinstance(key, str):
            raise TypeError(f"names must be str, not {type(key).__name__}")
        found.add(key)
    if not found:
        raise ValueError("names must name at least one lock")
    if len(found) > MAX_MANY:
        raise ValueError(f"names: at most {MAX_MANY} locks at once, not {len(found)}")
    return sorted(found)


def _triplets(keys: Sequence[str]) -> list[str]:
    return [part for key in keys for part in (key, key + LINE, key + LAPSE)]


def _quadruplets(keys: Sequence[str]) -> list[str]:
    """A multi-lock's acquire also reads each name's readers: it is their write lease."""
    return [part for key in keys for part in (key, key + LINE, key + LAPSE, key + READERS)]


def acquire_many_command(
    keys: Iterable[str], token: str, ttl_ms: int, owner: str, quarantine_ms: int
) -> Command:
    """Take every key of ``keys`` or none (``scripts/acquire_many.lua``); post it with
    ``identify=True``. Reply: ``OK`` when all are held, else the ms until they are free here.

    Raises:
        TypeError, ValueError: see :func:`many_keys`.
    """
    names = (NODE_KEY, *_quadruplets(many_keys(keys)))
    return _granting(ACQUIRE_MANY, names, (token, ttl_ms, owner, quarantine_ms))


def release_many_command(keys: Iterable[str], token: str) -> Command:
    """Release every key of ``keys`` that holds ``token``; reply: how many. Idempotent: its
    EVAL fallback is sent even after the operation is over."""
    return RELEASE_MANY.command(_triplets(many_keys(keys)), (token,), fallback_when_over=True)


def extend_many_command(keys: Iterable[str], token: str, ttl_ms: int, owner: str) -> Command:
    """Renew every key of ``keys`` or none, re-creating keys a node lost
    (``scripts/extend_many.lua``). Reply: 1 renewed, 2 some re-created, -1 another holder has
    one of them here."""
    names = [part for key in many_keys(keys) for part in (key, key + READERS)]
    args = (token, ttl_ms, owner)
    fallback = Fallback(partial(EXTEND_MANY.eval, names, args), False)
    return (EXTEND_MANY.evalsha(names, args), fallback)


def owns_many_command(keys: Iterable[str], token: str) -> Command:
    """Does a node still hold every key of ``keys`` for ``token``; reply: 1 or 0."""
    return OWNS_MANY.command(many_keys(keys), (token,))


# -- hand-off ----------------------------------------------------------------------------


def handoff_command(
    keys: Iterable[str], old: str, new: str, owner: str, quarantine_ms: int
) -> Command:
    """Hand the lease on ``keys`` (a lock, a write lease, a semaphore slot, or every key of a
    multi-lock) from token ``old`` to ``new``, keeping the expiry (``scripts/handoff.lua``);
    post it with ``identify=True``. Reply: the ms left, or :data:`HANDOFF_REFUSED`.

    Raises:
        TypeError, ValueError: see :func:`many_keys`; ``new`` equal to ``old``.
    """
    if new == old:
        raise ValueError("new: the adopter's token must differ from the handle's")
    return _granting(HANDOFF, (NODE_KEY, *many_keys(keys)), (old, new, owner, quarantine_ms))


def handback_command(
    keys: Iterable[str], adopter_token: str, handle_token: str, quarantine_ms: int
) -> Command:
    """Undo a hand-off that failed: keys holding ``adopter_token`` hold ``handle_token`` again,
    keeping their expiry (``scripts/handoff.lua`` with the tokens swapped), so the handle
    stays adoptable until its lease runs out. The owner record stays the failed adopter's
    (the giver's is not kept on the nodes) until the handle is adopted again. A
    clean-up: posted without ``identify`` (the node checks its own process), sent even after
    the operation is over, idempotent. Reply: the ms left, or :data:`HANDOFF_REFUSED`.
    """
    if adopter_token == handle_token:
        raise ValueError("adopter_token: must differ from the handle's")
    return HANDOFF.command(
        (NODE_KEY, *many_keys(keys)),
        (adopter_token, handle_token, "", quarantine_ms, *_IDENTITY_UNKNOWN),
        fallback_when_over=True,
    )
