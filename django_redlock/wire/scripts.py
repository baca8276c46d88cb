"""The Lua scripts and the commands that run them: one place for what goes on the wire.

Each script lives in ``django_redlock/scripts/<name>.lua`` with a KEYS/ARGV/return header; a
``-- @include <file>.lua`` line pulls in shared code (``node_rule.lua``). Commands are sent as
EVALSHA with EVAL as the fallback when a node answers NOSCRIPT (after ``SCRIPT FLUSH``, a
restart or a failover). The hot-path encoders format RESP with f-strings: several times faster
than the generic encoder for the three scripts every lock runs.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path

from django_redlock.wire.resp import encode_command, encode_parts

__all__ = [
    "ACQUIRE",
    "DECLARE_FRESH",
    "EXTEND",
    "FORCE_RELEASE",
    "GONE",
    "GRANTED",
    "HOLDER",
    "HOT_SCRIPTS",
    "LAPSE",
    "LEAVE",
    "LINE",
    "LISTING",
    "LISTING_SHARD",
    "NODE_KEY",
    "NODE_STATE",
    "OWNS",
    "PING",
    "RELEASE",
    "Command",
    "Commands",
    "Fallback",
    "Script",
    "acquire_command",
    "extend_command",
    "fire_and_forget",
    "leave_command",
    "load_script",
    "owns_command",
    "release_command",
]

_SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


# The literals that name a node's own records in the scripts: the restart marker, and the
# owner records' ending. On a cluster node each shard keeps its own (Script.for_shard).
_NODE_RECORDS = (b"'\\0django_redlock:node'", b"':django_redlock:node'")

# The start of every shard variant: KEYS as the script reads them, each key that names the
# marker in the lock's slot (``{<lock's tag>}`` then NODE_KEY, see cluster_route.cluster_form;
# a lock key never ends so, names hold no control character) replaced by the shard's marker. A local
# copy: the variant's code after it (and its included functions) reads the local. The
# suffix is double-quoted so that the literal replacement above leaves it alone.
_SHARD_PROLOGUE = b"""local KEYS = KEYS
do
    local copy
    for i = 1, #KEYS do
        if string.sub(KEYS[i], -20) == "\\0django_redlock:node" then
            if copy == nil then
                copy = {}
                for j = 1, #KEYS do copy[j] = KEYS[j] end
            end
            copy[i] = '\\0django_redlock:node{<TAG>}'
        end
    end
    if copy ~= nil then KEYS = copy end
end
"""

# The start of the shard variant of a script that declares its first key alone on a cluster
# node (Script.cluster_one_key): the command carries its other keys at the head of ARGV,
# after their count (cluster_route.cluster_form), and the variant reads KEYS and ARGV as
# the plain script does. Before the marker's prologue, which then reads these KEYS.
_ONE_KEY_PROLOGUE = b"""local KEYS, ARGV = KEYS, ARGV
do
    local more = tonumber(ARGV[1])
    local keys, argv = {KEYS[1]}, {}
    for i = 1, more do keys[i + 1] = ARGV[i + 1] end
    for i = more + 2, #ARGV do argv[#argv + 1] = ARGV[i] end
    KEYS, ARGV = keys, argv
end
"""

SCRIPTS_BY_SHA: dict[bytes, Script] = {}
"""Every script this process loaded (:func:`load_script`), by its SHA1 digest: the cluster
transport finds the script an EVALSHA names, to send its shard's variant instead."""


class Script:
    """A Lua script sent as EVALSHA, with EVAL as the fallback on NOSCRIPT."""

    def __init__(self, source: str, *, register: bool = True) -> None:
        # Set for HOT_SCRIPTS, which every new connection loads before anything else.
        self.preloaded = False
        # Keys the script derives from KEYS[1] (suffixes) that a cluster node's command
        # declares too (wire/cluster_route.py: cluster_form), so that the server refuses it
        # while a slot migration has split them between two shards (see ACQUIRE below).
        self.cluster_keys: tuple[str, ...] = ()
        # Declares its first key alone on a cluster node, its other keys sent as arguments
        # (see EXTEND below); the shard variant reads them as keys again.
        self.cluster_one_key = False
        self.source = source.encode()
        self.sha = hashlib.sha1(self.source, usedforsecurity=False).hexdigest().encode()
        self._evalsha_head = encode_parts((b"EVALSHA", self.sha))
        self._shards: dict[str, Script] = {}
        if register:
            SCRIPTS_BY_SHA[self.sha] = self

    def for_shard(self, tag: str) -> Script:
        """This script as one shard of a cluster node runs it: the node's records (restart
        marker, owner records) named with the shard's hash ``tag`` (see
        :func:`~django_redlock.wire.cluster.marker_tag`), so they live in a slot the shard
        serves. A script may read and write keys of any slot its shard serves (scripts
        without a ``#!lua`` flags line, on Redis 7 and Valkey: tests/cluster check both), not
        of another shard's: one marker per shard, and a shard votes by its own rule.
        Cached per tag.

        A script that takes the marker as one of its KEYS (a semaphore's, a read-write
        lock's, a multi-lock's, a hand-off's acquire) gets it there in a form of the lock's
        slot, ``{<the lock's tag>}`` then :data:`NODE_KEY` (a cluster refuses a command whose
        KEYS span slots, CROSSSLOT, before the script runs): the variant starts by putting the
        shard's marker in its place, in a local copy of KEYS."""
        variant = self._shards.get(tag)
        if variant is None:
            source = self.source
            for literal in _NODE_RECORDS:
                source = source.replace(literal, literal[:-1] + b"{" + tag.encode() + b"}'")
            source = _SHARD_PROLOGUE.replace(b"<TAG>", tag.encode()) + source
            if self.cluster_one_key:
                source = _ONE_KEY_PROLOGUE + source
            variant = Script(source.decode(), register=False)
            variant.preloaded = self.preloaded
            self._shards[tag] = variant
        return variant

    def evalsha(
        self, keys: Sequence[bytes | str], args: Sequence[bytes | str | int], trailing: int = 0
    ) -> bytes:
        """EVALSHA of ``keys`` and ``args``; ``trailing`` more arguments are counted in the
        header but left for the sender to append (see ``Transport.run(identify=True)``)."""
        parts = (len(keys), *keys, *args)
        return b"*%d\r\n" % (len(parts) + 2 + trailing) + self._evalsha_head + encode_parts(parts)

    def head(self, keys: int, arguments: int) -> str:
        """The text that starts ``EVALSHA <sha> <keys>`` for ``keys`` keys and ``arguments``
        ARGVs, for callers that format the rest themselves (an f-string is several times
        faster than the generic encoder on the hot path)."""
        return (
            f"*{3 + keys + arguments}\r\n$7\r\nEVALSHA\r\n$40\r\n{self.sha.decode()}\r\n"
            f"$1\r\n{keys}\r\n"
        )

    def command(
        self,
        keys: Sequence[bytes | str],
        args: Sequence[bytes | str | int],
        *,
        fallback_when_over: bool = False,
    ) -> Command:
        """EVALSHA, with EVAL as the NOSCRIPT fallback.

        ``fallback_when_over``: send the EVAL even when the operation already has its answer
        (right for an idempotent clean-up such as a release; wrong for an acquire, whose late
        EVAL would take a key nobody will release).
        """
        return (
            self.evalsha(keys, args),
            Fallback(
                partial(self.eval, keys, args),
                fallback_when_over,
                eager=fallback_when_over and not self.preloaded,
            ),
        )

    def eval(
        self, keys: Sequence[bytes | str], args: Sequence[bytes | str | int], trailing: int = 0
    ) -> bytes:
        """EVAL of ``keys`` and ``args``; ``trailing`` as for :meth:`evalsha`."""
        if not trailing:
            return encode_command(b"EVAL", self.source, len(keys), *keys, *args)
        parts = (b"EVAL", self.source, len(keys), *keys, *args)
        return b"*%d\r\n" % (len(parts) + trailing) + encode_parts(parts)


class Fallback:
    """How to rebuild a command if the node answers NOSCRIPT (built lazily: the script source
    is only sent to a node that lacks it), and whether to do so after the operation is over.

    ``eager``: a clean-up sent without waiting for its reply (``clean_up``, ``post``) goes
    as the EVAL at once. Nobody may ever read its NOSCRIPT (the manager may not be used
    again), so an EVALSHA of a script not loaded on every new connection could leave the
    keys it was sent to free held until they run out.

    ``identify``: the EVAL, like the EVALSHA it replaces, is completed by the sender with the
    connection's identity (the run_id and persistence the granting scripts' vote gate reads).
    Sent without it, a script not preloaded (a semaphore's, a read-write lock's) met a
    brand-new durable node on its first use as "durability not checked yet": refused.
    """

    __slots__ = ("build", "eager", "identify", "when_over")
    # The replies of a grant or a renewal: a node with REPLICA_ACKS counts them only once WAIT
    # confirms its replicas have them (wire/acks.py). Empty for every other command.
    acked_yes: tuple[object, ...] = ()

    def __init__(
        self,
        build: Callable[[], bytes],
        when_over: bool,
        eager: bool = False,
        identify: bool = False,
    ) -> None:
        self.build = build
        self.when_over = when_over
        self.eager = eager
        self.identify = identify


class _AcquireFallback(Fallback):
    """An acquire's fallback (never sent once the round is over, not eager, sent without the
    identity), made with no Python ``__init__`` call (see _new_fallback): on every acquire."""

    __slots__ = ()
    when_over = False  # a class constant where Fallback has a slot
    eager = False
    identify = False
    acked_yes = (b"OK",)  # GRANTED


class _ReleaseFallback(Fallback):
    """A release's fallback (sent even once the operation is over; release.lua is
    preloaded, so not eager; without the identity)."""

    __slots__ = ()
    when_over = True
    eager = False
    identify = False


class _IdentifiedReleaseFallback(_ReleaseFallback):
    """A holder's release fallback, completed by the connection's identity."""

    __slots__ = ()
    identify = True


# Makes a fallback of one of these classes, its ``build`` then set: C calls only (Fallback's
# own __init__ is a Python call, two per acquire+release pair).
_new_fallback = object.__new__


def fire_and_forget(command: Command) -> Command:
    """``command`` as a clean-up sends it: its EVAL when its fallback is ``eager``."""
    fallback = command[1]
    if fallback is not None and fallback.eager:
        return (fallback.build(), None)
    return command


# A command for one node: its bytes, and its NOSCRIPT fallback (None for plain commands).
Command = tuple[bytes, Fallback | None]
# One command per node, in the nodes' order; None skips that node.
Commands = Sequence[Command | None]


_INCLUDE = re.compile(r"^-- @include (\w+\.lua)$", re.MULTILINE)


def load_script(name: str) -> Script:
    """The script ``scripts/<name>.lua``, with each ``-- @include <file>.lua`` line replaced by
    that file (Lua has no ``require`` in Redis): shared code lives in one place, and the
    digest covers the text the nodes run. An included file comes without its comment lines:
    the script's own header stays, and each node caches every script's text, so the included
    files' explanations (several KB, repeated in most scripts) would only cost memory there."""
    source = (_SCRIPTS / f"{name}.lua").read_text(encoding="utf-8")
    return Script(_INCLUDE.sub(lambda m: _included(m[1]), source))


def _included(name: str) -> str:
    lines = (_SCRIPTS / name).read_text(encoding="utf-8").splitlines()
    return "\n".join(line for line in lines if line.strip() and not line.lstrip().startswith("--"))


ACQUIRE = load_script("acquire")
RELEASE = load_script("release")
EXTEND = load_script("extend")
GRANTED = b"OK"
# Two more arguments end every acquire: the connection's identity, appended per node by the
# transport (see scripts/acquire.lua and wire.setup.Hello). One key: the script names the
# others after it (each argument costs the node about what a redis.call does).
_ACQUIRE_HEAD = ACQUIRE.head(1, 10)
LEAVE = load_script("leave")
# A lock's wait line and the lapse times of its places: the NUL byte keeps these apart from
# every lock key (names cannot contain control characters).
LINE = "\x00q"
LAPSE = "\x00e"
READERS = "\x00r"
GONE = "\x00x"
"""After a lock key, then a waiter's hand-off token: the mark of a waiter whose acquire is over
on that node, which refuses its late tries (``scripts/hand_gone.lua``)."""
# On a cluster node the acquire declares the keys its decision reads too: during a slot's
# migration a key the script only derives is read on whichever shard runs it, so a lock key
# absent on the source (ASK) would be decided on the target without the readers still on the
# source (a write grant beside live readers). Declared, a split or missing key makes the
# server answer TRYAGAIN: a no vote for that round. Plain nodes send one key, as before.
ACQUIRE.cluster_keys = (LINE, LAPSE, READERS)
# A renewal on a cluster node declares the lock key alone (its readers' key goes as an
# argument): while the lock's slot migrates, the server then sends it where the key is (the
# source, or after ASK the importing shard), so a holder renews through a migration; with
# both declared it answered TRYAGAIN until the slot was handed over, as the readers' key is
# absent nearly always. Safe: renewing reads and writes the lock key only; re-creating a lost
# key reads the readers first, and a script that reaches a key not on its shard stops there
# with an error before it writes anything.
EXTEND.cluster_one_key = True
# One key, as the acquire's: the script names the line and lapse keys after it.
_RELEASE_HEAD = RELEASE.head(1, 2)
_RELEASE_HEAD_IDENTIFIED = RELEASE.head(1, 4)  # + the identity the transport appends

NODE_KEY = "\x00django_redlock:node"
"""Each node's marker hash (see ``scripts/node_rule.lua``): the server process found fit to
vote, and the longest quarantine any client declared. The NUL byte keeps it apart from every
lock key: lock names cannot contain control characters."""
_NODE_BULK = f"${len(NODE_KEY)}\r\n{NODE_KEY}\r\n"
NODE_STATE = load_script("node_state")
DECLARE_FRESH = load_script("declare_fresh")
PING: Command = (b"*1\r\n$4\r\nPING\r\n", None)
HOLDER = load_script("holder")
LISTING = load_script("listing")
LISTING_SHARD = load_script("listing_shard")
OWNS = load_script("owns")
FORCE_RELEASE = load_script("force_release")


# Hot-path encoders for the three scripts. Tokens and owner JSON are ASCII; a key with
# non-ASCII characters (len in characters != len in bytes) takes the generic encoder.

# The numbers of an acquire that stay the same for a manager (ttl, quarantine, line lifetime),
# encoded once as RESP bulk strings: a handful of values per process, so a plain dict (read
# with .get, no Python call), cleared if a caller ever sends many different ones.
_BULK_NUMBERS: dict[int, str] = {}


def _bulk_number(number: int) -> str:
    if len(_BULK_NUMBERS) > 256:
        _BULK_NUMBERS.clear()
    digits = str(number)
    text = _BULK_NUMBERS[number] = f"${len(digits)}\r\n{digits}\r\n"
    return text


def _acquire_eval(key: str, args: tuple[str | int, ...]) -> bytes:
    # The EVAL fallback names no process (the node then checks itself: see node_rule.lua).
    return ACQUIRE.eval((key,), (*args, "", ""))


def acquire_command(
    key: str,
    token: str,
    ttl_ms: int,
    owner: str,
    quarantine_ms: int,
    waiter: str = "",
    ticket: int = 0,
    lifetime_ms: int = 0,
    hand_round: int = 0,
) -> Command:
    args = (token, ttl_ms, owner, quarantine_ms, waiter, ticket, lifetime_ms, hand_round)
    # Built only if a node answers NOSCRIPT (its keys too).
    fallback = _new_fallback(_AcquireFallback)
    fallback.build = partial(_acquire_eval, key, args)
    if key.isascii() and owner.isascii():
        ticket_text = str(ticket)  # a time in µs: differs on every acquire
        numbers = _BULK_NUMBERS
        ttl = numbers.get(ttl_ms) or _bulk_number(ttl_ms)
        quarantine = numbers.get(quarantine_ms) or _bulk_number(quarantine_ms)
        lifetime = numbers.get(lifetime_ms) or _bulk_number(lifetime_ms)
        text = (
            f"{_ACQUIRE_HEAD}${len(key)}\r\n{key}\r\n$40\r\n{token}\r\n{ttl}"
            f"${len(owner)}\r\n{owner}\r\n{quarantine}"
            f"${len(waiter)}\r\n{waiter}\r\n${len(ticket_text)}\r\n{ticket_text}\r\n"
            f"{lifetime}{numbers.get(hand_round) or _bulk_number(hand_round)}"
        )
        return (text.encode(), fallback)
    return (ACQUIRE.evalsha((key,), args, trailing=2), fallback)


def leave_command(key: str, waiter: str, token: str = "", gone: bool = False) -> Command:
    """Drop ``waiter``'s place in the line of lock ``key`` (``scripts/leave.lua``); with
    ``token`` (a waiter's hand-off token), also free the lock where it holds it; with
    ``gone``, leave the waiter's gone mark, which refuses a try of its that runs there late
    (``scripts/hand_gone.lua``). Idempotent, so its EVAL fallback is sent even after the
    operation is over."""
    args: tuple[str, ...] = (waiter, token) if token or gone else (waiter,)
    if gone:
        args += ("1",)
    return LEAVE.command((key, key + LINE, key + LAPSE), args, fallback_when_over=True)


def release_command(key: str, token: str, waiter: str = "", identified: bool = False) -> Command:
    """Free the lease on ``key`` where it holds ``token`` (``scripts/release.lua``).

    ``identified``: the command's header counts two more arguments, the connection's identity,
    which the transport then appends: post it with ``identify=True`` (and only then). With it
    a release that hands the lock to the next waiter spares the node an INFO call
    (``scripts/hand_grant.lua``)."""
    # The fallback is sent even when the release already has its answer: deleting our own
    # key late is always right, and leaving it would block the next holder until expiry.
    trailing = 2 if identified else 0
    fallback = _new_fallback(_IdentifiedReleaseFallback if identified else _ReleaseFallback)
    fallback.build = partial(_release_eval, key, token, waiter, trailing)
    if key.isascii():
        text = (
            f"{_RELEASE_HEAD_IDENTIFIED if identified else _RELEASE_HEAD}"
            f"${len(key)}\r\n{key}\r\n$40\r\n{token}\r\n${len(waiter)}\r\n{waiter}\r\n"
        )
        return (text.encode(), fallback)
    return (RELEASE.evalsha((key,), (token, waiter), trailing=trailing), fallback)


def _release_eval(key: str, token: str, waiter: str, trailing: int = 0) -> bytes:
    return RELEASE.eval((key,), (token, waiter), trailing=trailing)


def owns_command(key: str, token: str) -> Command:
    return OWNS.command((key,), (token,))


def extend_command(key: str, token: str, ttl_ms: int, owner: str) -> Command:
    """Renew the lease on ``key`` to ``ttl_ms`` from now, or re-create it where the node lost
    it (``scripts/extend.lua``; ``owner`` is stored then). Reply: 1 renewed, 2 re-created, -1
    another holder has it here. The EVAL fallback is never sent once the round is over (a
    late re-creation would be a key nobody counted)."""
    keys = (key, key + "\x00r")
    args = (token, ttl_ms, owner)
    return (EXTEND.evalsha(keys, args), _ExtendFallback(partial(EXTEND.eval, keys, args), False))


class _ExtendFallback(Fallback):
    """A renewal's fallback: as Fallback's, and a renewal is acknowledged where the node has
    REPLICA_ACKS (wire/acks.py): 1 renewed, 2 re-created."""

    __slots__ = ()
    acked_yes = (1, 2)


# A waiter's clean-ups (procedures/flow.py: Acquire._hand_clean_up): preloaded, so they go as a
# short EVALSHA behind the try they follow, never as the source to a node that may be stalled.
HAND_YIELD = load_script("hand_yield")
HAND_UNDO = load_script("hand_undo")
HOT_SCRIPTS = (ACQUIRE, RELEASE, EXTEND, HOLDER, LEAVE, FORCE_RELEASE, OWNS, HAND_YIELD, HAND_UNDO)
"""Loaded with SCRIPT LOAD on every new connection, so EVALSHA finds them at once."""
for _script in HOT_SCRIPTS:
    _script.preloaded = True


def hand_yield_command(
    key: str, token: str, waiter: str, ticket: int, lifetime_ms: int, round_: int
) -> Command:
    """After failed round ``round_`` of a waiter taking hand-off grants: give the lock it holds
    with ``token`` to an older waiter in line, if any, unless a later try of ``waiter`` ran
    there (``scripts/hand_yield.lua``). Idempotent, so its EVAL fallback is sent even after the
    operation is over."""
    return HAND_YIELD.command(
        (key, key + LINE, key + LAPSE),
        (token, waiter, ticket, lifetime_ms, round_),
        fallback_when_over=True,
    )


def hand_undo_command(key: str, token: str, waiter: str, round_: int) -> Command:
    """After a try of round ``round_`` whose reply was lost: delete the key it may have taken
    for ``token`` unless a later try of ``waiter`` ran there (``scripts/hand_undo.lua``).
    Idempotent, so its EVAL fallback is sent even after the operation is over."""
    return HAND_UNDO.command(
        (key, key + LINE, key + LAPSE), (token, waiter, round_), fallback_when_over=True
    )
