"""What operators ask: which locks are held, by whom, on which nodes, and is each node sound.

Used by ``manage.py redlock_status`` and the admin page; imports no Django. Every node is
asked through a redis-py client that never retries and waits at most ``timeout`` seconds per
command, so a stopped node costs one timeout and never hangs the report. Keys are found with
``SCAN`` (never ``KEYS``) and read in batches by one script call per 1,000 keys; glob
characters in the prefix are escaped.
"""

from __future__ import annotations

import contextlib
import hashlib
import heapq
import json
import re
import time
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol, TypeVar, cast

import redis

from django_redlock.wire.clients import client_for
from django_redlock.wire.nodes import NodeAddress
from django_redlock.wire.primitives import READER_OWNERS
from django_redlock.wire.scripts import (
    DECLARE_FRESH,
    HOLDER,
    LISTING,
    NODE_KEY,
    NODE_STATE,
    READERS,
)
from django_redlock.wire.sync import persistence_hint, quarantine_of

__all__ = [
    "Declaration",
    "LockInfo",
    "LockListing",
    "LockNodes",
    "NodeStatus",
    "Report",
    "declare_fresh",
    "list_locks",
    "status",
]


class LockNodes(Protocol):
    """What the operator queries need to know of a manager's nodes
    (:class:`~django_redlock.LockManager` is one)."""

    @property
    def addresses(self) -> tuple[NodeAddress, ...]:
        """The nodes, in the manager's order."""

    @property
    def key_prefix(self) -> str:
        """Prepended to every lock name to form its key."""

    @property
    def quorum(self) -> int:
        """How many nodes make a majority."""

    @property
    def quarantine_ms(self) -> int:
        """The restart quarantine the manager sends with every acquire, in milliseconds."""


_T = TypeVar("_T")
_Item = TypeVar("_Item")


def _each_node(items: Sequence[_Item], probe: Callable[[_Item], _T]) -> list[_T]:
    """``probe`` on every node's item at once (a thread each), in order: a stopped or paused
    node costs one timeout for the whole call, not one per node."""
    if len(items) <= 1:
        return [probe(item) for item in items]
    with ThreadPoolExecutor(max_workers=len(items)) as pool:
        return list(pool.map(probe, items))


_GLOB = str.maketrans({char: "\\" + char for char in "*?[]\\"})


def escape_glob(text: str) -> str:
    """``text`` with the SCAN MATCH glob characters escaped (``job*`` matches only itself)."""
    return text.translate(_GLOB)


@dataclass(frozen=True)
class LockInfo:
    """One held lease as seen across the nodes: a lock (or a write lease, or a lock of a
    ``lock_many``), a semaphore slot, or one reader of a read-write lock.

    Attributes:
        name: the lock name (the key without the prefix).
        nodes: how many nodes hold a key for it.
        total: how many nodes were asked.
        partial: held on fewer than a quorum: a leftover (a failed acquire's key, or a lease
            that expired elsewhere), not a lock anyone holds.
        ttl_min, ttl_max: remaining seconds of its keys (None when unknown).
        owner: the owner metadata found on most nodes (host, pid, thread, task, origin,
            acquired_at); never the token.
        kind: ``"lock"``, ``"semaphore"`` (one slot) or ``"read"`` (one reader).
        slot: the semaphore slot (0 … limit - 1), else None.
    """

    name: str
    nodes: int
    total: int
    partial: bool
    ttl_min: float | None
    ttl_max: float | None
    owner: dict[str, Any] = field(default_factory=dict)
    kind: str = "lock"
    slot: int | None = None

    @property
    def label(self) -> str:
        """The name, with the kind when it is not a lock (``"api [semaphore slot 1]"``)."""
        if self.kind == "semaphore":
            return f"{self.name} [semaphore slot {self.slot}]"
        if self.kind == "read":
            return f"{self.name} [read]"
        return self.name


@dataclass(frozen=True)
class LockListing:
    """The leases a listing found: the ones shown, and how many it did not show.

    Attributes:
        locks: the leases shown, ordered by name (then kind, then slot): all of them when the
            listing had no cap, else the first ``limit``. The cap only chooses which leases
            are shown: each shown lease's node count was read on every reachable node, so a
            lease is ``partial`` only when fewer than a quorum of nodes hold it.
        unreachable: the labels of the nodes that could not be read (counted in no lease).
        approx_total: about how many leases exist under the prefix: those shown, plus one per
            lease key that a node's SCAN found and the listing did not show (the readers of a
            read-write lock not shown count as one). About, because a key taken or expiring
            during the SCAN may be missed or counted, and leftovers count too.
        not_shown: ``approx_total - len(locks)``; 0 when every lease found is shown.
    """

    locks: list[LockInfo]
    unreachable: list[str]
    approx_total: int
    not_shown: int

    @property
    def truncated(self) -> bool:
        """Whether the cap left leases out (``not_shown > 0``)."""
        return self.not_shown > 0


_SLOT = re.compile(rb"^(.*)\x00s(\d+)$", re.DOTALL)

_SCAN_COUNT = 1000
"""SCAN's COUNT hint (how much of the keyspace one call walks): about a millisecond of work
on the node per call, and 50 round trips, not 250, to walk 50,000 keys."""
_BATCH = 1000
"""Keys per ``listing.lua`` call: about a millisecond of work on the node, so a listing never
holds a node up for long, whatever its size."""


def list_locks(
    manager: LockNodes,
    prefix: str = "",
    *,
    limit: int | None = 1000,
    contains: str = "",
    timeout: float = 0.25,
    skip: Collection[str] = (),
) -> LockListing:
    """Every held lease whose name starts with ``prefix`` (locks, semaphore slots, readers),
    merged across the nodes, or the first ``limit`` of them by name.

    Two rounds, each on all nodes at once. First, each node's keys under the prefix are
    walked with SCAN (never KEYS), to find and count its lease keys. Then every node is asked
    about the same keys, in one pipeline of ``scripts/listing.lua`` calls (1,000 keys each):
    all the keys found, or with a cap, the union of each node's first ``limit`` by name (it
    holds the cluster's first ``limit``). So a shown lease's node count is what every node
    said about that very key, whatever the cap: ``partial`` flags leftovers, never leases the
    cap hid on some node. ``not_shown`` says how many were left out.

    Args:
        prefix: only leases whose name starts with it (glob characters match themselves).
        limit: how many leases to show at most, or None for all of them.
        contains: only leases whose name contains it after ``prefix``, ignoring case (the
            admin's search): matched by SCAN on the nodes, so the cap applies to the matches.
        timeout: seconds per command on each node.
        skip: labels of nodes not to ask (found down a moment ago); they count as
            unreachable.

    Raises:
        TypeError: ``prefix`` or ``contains`` is not a str, or ``limit`` is not an int or
            None (or is a bool).
        ValueError: ``limit`` is below 1.
    """
    if not isinstance(prefix, str):
        raise TypeError(f"prefix must be a str, not {type(prefix).__name__}")
    if not isinstance(contains, str):
        raise TypeError(f"contains must be a str, not {type(contains).__name__}")
    if limit is not None:
        if isinstance(limit, bool) or not isinstance(limit, int):
            raise TypeError(f"limit must be an int or None, not {type(limit).__name__}")
        if limit < 1:
            raise ValueError(f"limit must be 1 or more (None: no cap), not {limit}")
    pattern = escape_glob(manager.key_prefix + prefix) + "*"
    if contains:
        pattern += _folded_glob(contains) + "*"
    with contextlib.ExitStack() as stack:
        clients = [
            None if address.label in skip else stack.enter_context(client_for(address, timeout))
            for address in manager.addresses
        ]
        walks = _each_node(
            clients, lambda client: None if client is None else _walk(client, pattern)
        )
        found: set[bytes] = set()
        wanted: set[bytes] = set()
        start = len(manager.key_prefix)
        after = start + len(prefix.encode())  # where the part of a key after prefix starts
        for walk in walks:
            if walk is None:
                continue
            if contains:  # exactly, before the cap: the glob matched a few more
                walk = {key for key in walk if _name_contains(key, after, contains.lower())}
            found |= walk
            if limit is None or len(walk) <= limit:
                wanted |= walk
            else:
                wanted.update(heapq.nsmallest(limit, walk, key=_sort_key))
        ordered = sorted(wanted, key=_sort_key)
        plain = [key for key in ordered if not key.endswith(READERS_SUFFIX)]
        readers = [key for key in ordered if key.endswith(READERS_SUFFIX)]
        reads = _each_node(
            list(zip(clients, walks, strict=True)),
            lambda pair: (
                None if pair[0] is None or pair[1] is None else _read(pair[0], plain, readers)
            ),
        )
    unreachable = [
        address.label
        for address, read in zip(manager.addresses, reads, strict=True)
        if read is None
    ]
    answers = [read for read in reads if read is not None]
    locks = _merge(ordered, answers, start, len(manager.addresses), manager.quorum)
    shown = locks if limit is None else locks[:limit]
    # Leases read but cut, and lease keys found but never read (with a cap: beyond every
    # node's first `limit`), each counted once.
    not_shown = len(locks) - len(shown) + len(found - wanted)
    return LockListing(
        locks=shown,
        unreachable=unreachable,
        approx_total=len(shown) + not_shown,
        not_shown=not_shown,
    )


READERS_SUFFIX = READERS.encode()
OWNERS_SUFFIX = READER_OWNERS.encode()


def _folded_glob(text: str) -> str:
    """A SCAN MATCH glob for ``text`` anywhere in a key, ignoring case: each ASCII letter as
    ``[xX]``, any other character with another case as ``*`` (SCAN matches bytes, and a
    bracket would stand for one byte of a character of several), the rest as itself. It
    matches every name that contains ``text`` ignoring case, and a few more (the caller
    filters the keys exactly), except names whose characters lower to ASCII letters (the
    Kelvin sign).
    """
    parts = []
    for char in text:
        if char.isascii() and char.isalpha():
            parts.append(f"[{char.lower()}{char.upper()}]")
        elif char.lower() != char or char.upper() != char:
            parts.append("*")
        else:
            parts.append(escape_glob(char))
    return "".join(parts)


def _name_contains(key: bytes, start: int, folded: str) -> bool:
    """Whether the name of lease key ``key``, from byte ``start`` of the key on, contains
    ``folded`` (lower case), ignoring case."""
    return folded in _key_parts(key)[0][start:].decode("utf-8", "replace").lower()


def _key_parts(key: bytes) -> tuple[bytes, str, int]:
    """A lease key's name (with the key prefix), kind and slot (-1 when not a slot)."""
    if b"\x00" not in key:
        return (key, "lock", -1)
    slot = _SLOT.match(key)
    if slot is not None:
        return (slot[1], "semaphore", int(slot[2]))
    return (key[: -len(READERS_SUFFIX)], "read", -1)


def _sort_key(key: bytes) -> bytes:
    """Where a lease key sorts, in the order leases are shown: by name (UTF-8 bytes sort as
    the names do), then the lock, its readers, its slots by number. That is the keys' own
    byte order but for slot numbers (names hold no control character, so the keys of one
    name follow the name itself, and "" < "\\x00r" < "\\x00s"); slot numbers are padded. Plain
    bytes: a tuple per key made sorting 50,000 keys three times slower."""
    if b"\x00s" not in key:
        return key
    slot = _SLOT.match(key)
    return key if slot is None else slot[1] + b"\x00s" + slot[2].rjust(20, b"0")


def _walk(client: redis.Redis, pattern: str) -> set[bytes] | None:
    """One node's lease keys matching ``pattern`` (locks, semaphore slots, reader sets; not
    wait lines, lapse times, reader owners or the node marker), or None when the node could
    not be read. Walks the whole keyspace under the pattern: SCAN's cost is the keyspace's
    size whatever the cap, and the walk gives the count the listing reports."""
    keys: set[bytes] = set()
    cursor = 0
    try:
        while True:
            cursor, batch = client.scan(cursor, match=pattern, count=_SCAN_COUNT)
            keys.update(cast("list[bytes]", batch))  # client_for never decodes replies
            if cursor == 0:
                break
    except redis.RedisError:
        return None
    keys.difference_update(
        [
            key
            for key in keys
            if b"\x00" in key and not (key.endswith(READERS_SUFFIX) or _SLOT.match(key))
        ]
    )
    return keys


@dataclass
class _Read:
    """What one node said about the listing's keys."""

    owners: list[bytes | None]  # per plain key (lock, write lease, slot): owner JSON
    ttls: list[int]  # per plain key: PTTL in ms (-2: absent)
    # Per reader set: its members (token, expiry ms) and owners (token -> JSON), or the
    # error a node answered for either (a key of another type).
    readers: list[tuple[Any, Any]]
    now_ms: int | None  # the node's clock (readers' expiries are on it)


def _read(client: redis.Redis, plain: list[bytes], readers: list[bytes]) -> _Read | None:
    """One node's answers about ``plain`` keys (owner and ms left, by ``listing.lua``) and
    ``readers`` sets (members and owners), in one pipeline; None when it could not be read
    (also when its ACL user may not run scripts: such a node cannot hold locks either)."""
    try:
        pipe = client.pipeline(transaction=False)
        pipe.time()
        for index in range(0, len(plain), _BATCH):
            batch = plain[index : index + _BATCH]
            # The first call is an EVAL, which also caches the script on the node, so the
            # rest of the same pipeline can be EVALSHA without a NOSCRIPT round trip.
            if index == 0:
                pipe.eval(LISTING.source.decode(), len(batch), *batch)
            else:
                pipe.evalsha(LISTING.sha.decode(), len(batch), *batch)
        for key in readers:
            pipe.zrange(key, 0, -1, withscores=True)
            pipe.hgetall(key[: -len(READERS_SUFFIX)] + OWNERS_SUFFIX)
        replies = pipe.execute(raise_on_error=False)
    except redis.RedisError:
        return None
    clock, replies = replies[0], replies[1:]
    batches = (len(plain) + _BATCH - 1) // _BATCH
    flat: list[Any] = []
    for reply in replies[:batches]:
        if not isinstance(reply, list):
            return None  # the script was refused (an error reply)
        flat.extend(reply)
    now_ms = None
    if isinstance(clock, list | tuple):
        now_ms = int(clock[0]) * 1000 + int(clock[1]) // 1000
    pairs = replies[batches:]
    return _Read(
        owners=flat[0::2],
        ttls=flat[1::2],
        readers=list(zip(pairs[0::2], pairs[1::2], strict=True)),
        now_ms=now_ms,
    )


def _merge(
    ordered: list[bytes], answers: list[_Read], start: int, total: int, quorum: int
) -> list[LockInfo]:
    """The leases of the keys ``ordered`` (in that order) that at least one node holds, from
    every reachable node's answers about those very keys. ``start``: the key prefix's
    length."""
    if not answers:
        return []
    # Every node answered about the same keys, in the same order: line them up by key.
    plain = zip(
        zip(*(read.owners for read in answers), strict=True),
        zip(*(read.ttls for read in answers), strict=True),
        strict=True,
    )
    reader_sets = zip(*(read.readers for read in answers), strict=True)
    asked = len(answers)
    locks: list[LockInfo] = []
    # The loop runs once per lock (50,000 in a large listing): the common case, every node
    # with the same owner, takes no call but the owner's decoding.
    for key in ordered:
        if b"\x00" in key:
            name, kind, slot = _key_parts(key)
        else:
            name, kind, slot = key, "lock", -1
        if kind == "read":
            locks.extend(_readers(name[start:], next(reader_sets), answers, total, quorum))
            continue
        owners, ttls = next(plain)
        missing = ttls.count(-2)
        if missing == asked:
            continue  # gone everywhere (expired or released since the walk)
        raw = owners[0]
        if raw is None or owners.count(raw) != asked:  # nodes disagree, or some have none
            raw = _most(owners)
        left = [ttl for ttl in ttls if ttl >= 0]
        nodes = asked - missing
        locks.append(
            LockInfo(
                name[start:].decode("utf-8", "replace"),
                nodes,
                total,
                nodes < quorum,
                min(left) / 1000 if left else None,
                max(left) / 1000 if left else None,
                {} if raw is None else _owner(raw),
                kind,
                slot if kind == "semaphore" else None,
            )
        )
    return locks


def _readers(
    name: bytes,
    sets: tuple[tuple[Any, Any], ...],
    answers: list[_Read],
    total: int,
    quorum: int,
) -> list[LockInfo]:
    """The live readers of one read-write lock, each told apart across the nodes by a digest
    of its token (the token never leaves this function)."""
    seen: dict[str, tuple[list[bytes | None], list[int]]] = {}
    for (members, owners), read in zip(sets, answers, strict=True):
        if read.now_ms is None or not isinstance(members, list) or not isinstance(owners, dict):
            continue
        for token, expiry in members:
            left = int(expiry) - read.now_ms
            if left <= 0:
                continue  # an expired reader, not purged yet
            digest = hashlib.sha256(token).hexdigest()[:16]
            raws, lefts = seen.setdefault(digest, ([], []))
            raws.append(owners.get(token))
            lefts.append(left)
    infos = []
    for _, (raws, lefts) in sorted(seen.items()):
        raw = _most(raws)
        infos.append(
            LockInfo(
                name=name.decode("utf-8", "replace"),
                nodes=len(lefts),
                total=total,
                partial=len(lefts) < quorum,
                ttl_min=min(lefts) / 1000,
                ttl_max=max(lefts) / 1000,
                owner={} if raw is None else _owner(raw),
                kind="read",
            )
        )
    return infos


def _most(owners: Sequence[bytes | None]) -> bytes | None:
    """The owner JSON most nodes report (the first node's on a tie), None when none does."""
    counts: dict[bytes, int] = {}
    for raw in owners:
        if raw is not None:
            counts[raw] = counts.get(raw, 0) + 1
    return max(counts.items(), key=lambda item: item[1])[0] if counts else None


# json.loads checks its arguments, and decode() matches whitespace around the document, on
# every call: together as long as the decoding itself, which a listing does once per lock.
_OWNER_JSON = json.JSONDecoder()


def _owner(raw: bytes) -> dict[str, Any]:
    """The owner metadata stored with a key (JSON written by the library, no whitespace
    around it), or ``{"raw": text}`` when it is not a JSON object."""
    text = raw.decode("utf-8", "replace")
    try:
        parsed, end = _OWNER_JSON.raw_decode(text)
    except ValueError:
        return {"raw": text}
    return parsed if isinstance(parsed, dict) and end == len(text) else {"raw": text}


@dataclass(frozen=True)
class NodeStatus:
    """One node's health for operators; ``problems`` are errors, ``warnings`` are not.

    ``vote`` is "votes", "quarantined" or "down", by the rule the acquire script applies
    (``scripts/node_rule.lua``); ``vote_detail`` says why (for a quarantined node, the very
    text an acquire it refuses reports); ``votes_at`` is when a quarantined node votes again
    (epoch seconds; None when it cannot tell or already votes).
    """

    node: str
    reachable: bool
    latency_ms: float | None = None
    server: str | None = None
    version: str | None = None
    role: str | None = None
    run_id: str | None = None
    uptime_s: int | None = None
    maxmemory: int | None = None
    maxmemory_policy: str | None = None
    persistence: str | None = None
    clock_offset_ms: float | None = None
    quarantine_left_s: float | None = None
    vote: str = "down"
    vote_detail: str = ""
    votes_at: float | None = None
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def votes_again(self) -> datetime | None:
        """``votes_at`` as an aware UTC datetime (for pages)."""
        return None if self.votes_at is None else datetime.fromtimestamp(self.votes_at, UTC)

    @property
    def votes(self) -> bool:
        """Whether this node can vote for a lock right now (by the acquire script's rule)."""
        return self.reachable and not self.problems and self.vote == "votes"


@dataclass(frozen=True)
class Report:
    """Every node's status and the quorum verdict."""

    nodes: list[NodeStatus]
    quorum: int
    voting: int

    @property
    def healthy(self) -> bool:
        return self.voting >= self.quorum

    def as_dict(self) -> dict[str, Any]:
        return {
            "healthy": self.healthy,
            "quorum": self.quorum,
            "voting": self.voting,
            "nodes": [{**asdict(node), "votes": node.votes} for node in self.nodes],
        }


def _scripts_denied(client: redis.Redis, prefix: str) -> str | None:
    """Why this connection's user may not run the lock scripts on keys under ``prefix``
    (an ACL without EVALSHA/EVAL, or without those keys), or None when it may.

    Runs the read-only holder script on a key no lock uses: EVALSHA first (NOSCRIPT means it
    is allowed but not loaded yet), then EVAL, which the library falls back to.
    """
    probe_key = prefix + "\x00acl-probe"
    for attempt in ("evalsha", "eval"):
        try:
            if attempt == "evalsha":
                client.evalsha(HOLDER.sha.decode(), 1, probe_key)
            else:
                client.eval(HOLDER.source.decode(), 1, probe_key)
            return None
        except redis.exceptions.NoScriptError:
            continue
        except redis.exceptions.NoPermissionError as exc:
            return f"the ACL user may not run the lock scripts ({attempt.upper()}): {exc}"
        except redis.exceptions.ResponseError as exc:
            if "NOPERM" in str(exc):
                return f"the ACL user may not run the lock scripts ({attempt.upper()}): {exc}"
            raise
    return None


def _node_rule(client: redis.Redis, quarantine_ms: int, persistence: str) -> tuple[str, str, float]:
    """The node's verdict by ``scripts/node_rule.lua``, the rule the acquire script applies:
    ("votes", why, 0) or ("quarantined", the refusal text, seconds until it votes or -1)."""
    verdict, detail, left, _ = _run_script(
        client, NODE_STATE, (NODE_KEY,), (quarantine_ms, persistence)
    )
    return verdict.decode(), detail.decode(errors="replace"), int(left) / 1000


def _run_script(client: redis.Redis, script: Any, keys: Sequence[str], args: Sequence[Any]) -> Any:
    """EVALSHA, or EVAL when the node does not have the script yet."""
    try:
        return client.evalsha(script.sha.decode(), len(keys), *keys, *args)
    except redis.exceptions.NoScriptError:
        return client.eval(script.source.decode(), len(keys), *keys, *args)


def _persistence(client: redis.Redis) -> str:
    """The node's persistence as ``scripts/node_rule.lua`` takes it (CONFIG GET append*)."""
    try:
        reply = client.config_get("append*")
    except redis.RedisError:  # CONFIG is often denied by ACLs
        return persistence_hint(None)
    # redis-py answers with a dict (names to values).
    return persistence_hint([_bytes(item) for pair in dict(reply).items() for item in pair])


def _bytes(value: object) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()


# How the status shows the two plain cases of node_rule.lua's persistence argument.
_PERSISTENCE_SHOWN = {"always": "aof, appendfsync always", "appendonly no": "no aof"}


@dataclass
class _Seen:
    """What the first pass over a node found (the verdict needs every node's quarantine)."""

    info: dict[str, Any]
    latency: float
    offset: float
    persistence: str
    quarantine_ms: int
    denied: str | None


def _look(address: NodeAddress, manager: LockNodes, timeout: float) -> _Seen | str:
    """First pass: the node's INFO, clock, persistence and longest quarantine, or why it
    could not be read."""
    try:
        with client_for(address, timeout) as client:
            started = time.perf_counter()
            client.ping()
            latency = (time.perf_counter() - started) * 1000
            info = client.info()
            local_before = time.time()
            seconds, micros = client.time()
            local_after = time.time()
            persistence = _persistence(client)
            stored = client.hget(NODE_KEY, "q")
            denied = _scripts_denied(client, manager.key_prefix)
    except redis.RedisError as exc:
        return str(exc) or type(exc).__name__
    offset = (seconds + micros / 1e6 - (local_before + local_after) / 2) * 1000
    return _Seen(info, latency, offset, persistence, quarantine_of(stored), denied)


def _judge(
    address: NodeAddress,
    seen: _Seen | str,
    quarantine_ms: int,
    timeout: float,
) -> NodeStatus:
    """Second pass: the node's verdict by the acquire script's own rule, and its warnings."""
    label = address.label
    if isinstance(seen, str):
        return NodeStatus(node=label, reachable=False, vote="down", problems=[seen])
    info = seen.info
    problems: list[str] = []
    if seen.denied:
        problems.append(seen.denied)
    warnings: list[str] = []
    role = str(info.get("role", "unknown"))
    if role != "master":
        problems.append(f"role is {role}: a replica must never be a Redlock node")
    elif int(info.get("connected_slaves", 0) or 0) > 0:
        warnings.append("has replicas: a failover to one of them would forget locks")
    maxmemory = int(info.get("maxmemory", 0) or 0)
    policy = str(info.get("maxmemory_policy", "noeviction"))
    if maxmemory and policy != "noeviction":
        warnings.append(f"maxmemory-policy is {policy}: lock keys can be evicted; use noeviction")
    if seen.persistence != "always":
        warnings.append(
            f"not proven durable ({seen.persistence}): after a restart it is quarantined for "
            f"{quarantine_ms / 1000:g} s (the longest lease any client may take) before it votes"
        )
    if abs(seen.offset) > 500:
        warnings.append(f"clock differs from this host's by {seen.offset:.0f} ms")
    vote, detail, left = "down", "", 0.0
    if not seen.denied:
        try:
            with client_for(address, timeout) as client:
                vote, detail, left = _node_rule(client, quarantine_ms, seen.persistence)
        except redis.RedisError as exc:
            return NodeStatus(node=label, reachable=False, problems=[str(exc) or "no answer"])
    server = "valkey" if "valkey_version" in info else "redis"
    return NodeStatus(
        node=label,
        reachable=True,
        latency_ms=round(seen.latency, 3),
        server=server,
        version=str(info.get("valkey_version") or info.get("redis_version") or ""),
        role=role,
        run_id=str(info.get("run_id", "")),
        uptime_s=int(info.get("uptime_in_seconds", 0) or 0),
        maxmemory=maxmemory,
        maxmemory_policy=policy,
        persistence=_PERSISTENCE_SHOWN.get(seen.persistence, seen.persistence),
        clock_offset_ms=round(seen.offset, 1),
        quarantine_left_s=round(left, 3) if vote == "quarantined" else 0.0,
        votes_at=time.time() + left if vote == "quarantined" and left >= 0 else None,
        vote=vote,
        vote_detail=detail if vote == "quarantined" else f"votes ({detail})",
        problems=problems,
        warnings=warnings,
    )


def status(manager: LockNodes, *, timeout: float = 0.25) -> Report:
    """Probe every node at once (bounded by ``timeout`` per command) and judge the quorum.

    Each node's verdict comes from the rule the acquire script applies, with the longest
    quarantine any node reports (as a manager that contacts them uses).
    """
    addresses = manager.addresses
    seen = _each_node(addresses, lambda address: _look(address, manager, timeout))
    quarantine = max(
        [manager.quarantine_ms, *(item.quarantine_ms for item in seen if isinstance(item, _Seen))]
    )
    nodes = _each_node(
        list(zip(addresses, seen, strict=True)),
        lambda pair: _judge(pair[0], pair[1], quarantine, timeout),
    )
    by_run_id: dict[str, str] = {}
    for node in nodes:
        if node.run_id:
            if node.run_id in by_run_id:
                node.problems.append(
                    f"same server as {by_run_id[node.run_id]} (run_id): not an independent node"
                )
            by_run_id.setdefault(node.run_id, node.node)
    voting = sum(1 for node in nodes if node.votes)
    return Report(nodes=nodes, quorum=manager.quorum, voting=voting)


@dataclass(frozen=True)
class Declaration:
    """What :func:`declare_fresh` did on one node.

    Attributes:
        node: the node's label (URL without password).
        declared: the node's current process now votes at once.
        run_id: the server process declared (None when the node was not reached).
        uptime_s: how long that process had been up, in seconds.
        detail: a sentence for operators.
    """

    node: str
    declared: bool
    run_id: str | None = None
    uptime_s: int | None = None
    detail: str = ""


def _declare(address: NodeAddress, timeout: float) -> Declaration:
    label = address.label
    try:
        with client_for(address, timeout) as client:
            info = client.info("server")
            run_id = str(info.get("run_id", ""))
            uptime = int(info.get("uptime_in_seconds", 0) or 0)
            _run_script(client, DECLARE_FRESH, (NODE_KEY,), (run_id,))
    except redis.RedisError as exc:
        return Declaration(label, False, detail=f"not declared: {str(exc) or type(exc).__name__}")
    return Declaration(
        label,
        True,
        run_id,
        uptime,
        f"declared fresh: process {run_id[:8]} (up {uptime} s) votes at once; "
        "any restart of it is judged again",
    )


def declare_fresh(addresses: Sequence[NodeAddress], *, timeout: float = 1.0) -> list[Declaration]:
    """Declare the current server process of each node fresh: it votes at once, with no
    restart quarantine, until it restarts (the declaration names its run_id, see
    ``scripts/declare_fresh.lua``). All nodes at once; never raises for node failures.

    Only for brand-new nodes or nodes shut down cleanly with their data: on a node that lost
    locks whose leases still run, it allows a double grant.
    """
    return _each_node(list(addresses), lambda address: _declare(address, timeout))
