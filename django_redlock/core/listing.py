"""Which locks are held, by whom, on how many nodes: :func:`list_locks` (``manager.locks()``,
``manage.py redlock_status``, the admin page). Imports no Django.

Every node is asked through a redis-py client that never retries and waits at most
``timeout`` seconds per command, so a stopped node costs one timeout and never hangs the
listing. Keys are found with ``SCAN`` (never ``KEYS``; glob characters in the prefix escaped)
and read in batches by one script call per 1,000 keys.
"""

from __future__ import annotations

import contextlib
import hashlib
import heapq
import json
import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import redis

from django_redlock.core.fanout import LockNodes, each_node
from django_redlock.wire.clients import client_for
from django_redlock.wire.cluster import SlotMap, cluster_key, hash_tag, key_slot
from django_redlock.wire.cluster_route import ClusterRoute, current_map, known, remember
from django_redlock.wire.errors import NodeError
from django_redlock.wire.nodes import NodeAddress
from django_redlock.wire.primitives import READER_OWNERS
from django_redlock.wire.scripts import LISTING, LISTING_SHARD, READERS

__all__ = ["LockInfo", "LockListing", "escape_glob", "list_locks", "plain_key"]


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
        views = each_node(
            list(zip(manager.addresses, clients, strict=True)),
            lambda pair: None if pair[1] is None else _view(pair[0], pair[1], timeout, stack),
        )
        walks = each_node(
            views,
            lambda view: None if view is None else view.walk(pattern, manager.key_prefix),
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
        # Cluster nodes read each key in its cluster form, on the shard of its slot: both
        # computed once for every such node.
        forms = _Forms(plain, readers) if any(isinstance(v, _Cluster) for v in views) else None
        reads = each_node(
            list(zip(views, walks, strict=True)),
            lambda pair: (
                None if pair[0] is None or pair[1] is None else pair[0].read(plain, readers, forms)
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


class _Plain:
    """A plain node, as a listing reads it: one client."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client

    def walk(self, pattern: str, key_prefix: str) -> set[bytes] | None:
        return _walk(self.client, pattern)

    def read(self, plain: list[bytes], readers: list[bytes], forms: _Forms | None) -> _Read | None:
        return _read(self.client, plain, readers)


class _Cluster:
    """A cluster node, as a listing reads it: one client per shard master, each lock's keys
    read on the shard that serves its slot, in the cluster form (wire/cluster.py), the
    listing's keys in the plain form (the form of plain nodes, so they merge across nodes).
    A shard that cannot be read makes the whole node unreachable for the listing (its locks
    would be counted missing)."""

    def __init__(self, shards: list[tuple[redis.Redis, str]], slot_map: SlotMap) -> None:
        self.shards = shards
        self.map = slot_map
        self.index = {shard.master: at for at, shard in enumerate(slot_map.shards)}

    def walk(self, pattern: str, key_prefix: str) -> set[bytes] | None:
        # A lock's cluster key is its plain key wrapped in braces, or the plain key when it
        # has a hash tag already: one SCAN per shard finds both ("*" before the pattern),
        # and the plain form's prefix is checked on each.
        wanted = re.compile(_glob_regex(pattern), re.DOTALL)
        literal = _literal_prefix(pattern)  # no search text: a prefix test per key
        keys: set[bytes] = set()
        for client, _ in self.shards:
            walk = _walk(client, "*" + pattern)
            if walk is None:
                return None
            for key in walk:
                plain = plain_key(key, key_prefix)
                if plain is None:
                    continue
                if plain.startswith(literal) if literal is not None else wanted.match(plain):
                    keys.add(plain)
        return keys

    def read(self, plain: list[bytes], readers: list[bytes], forms: _Forms | None) -> _Read | None:
        if forms is None:
            forms = _Forms(plain, readers)
        by_shard: list[tuple[list[int], list[bytes], list[int], list[bytes]]] = [
            ([], [], [], []) for _ in self.shards
        ]
        for at, (key, slot) in enumerate(zip(forms.plain, forms.plain_slots, strict=True)):
            shard = self._shard(slot)
            if shard is not None:
                by_shard[shard][0].append(at)
                by_shard[shard][1].append(key)
        for at, (key, slot) in enumerate(zip(forms.readers, forms.reader_slots, strict=True)):
            shard = self._shard(slot)
            if shard is not None:
                by_shard[shard][2].append(at)
                by_shard[shard][3].append(key)
        owners: list[bytes | None] = [None] * len(plain)
        ttls = [-2] * len(plain)  # a key of a slot no shard serves: absent
        sets: list[tuple[Any, Any]] = [([], {})] * len(readers)
        for (client, tag), (at_plain, keys, at_readers, sets_here) in zip(
            self.shards, by_shard, strict=True
        ):
            if not keys and not sets_here:
                continue
            read = _read(client, keys, sets_here, tag)
            if read is None or read.now_ms is None:
                return None
            for at, owner, ttl in zip(at_plain, read.owners, read.ttls, strict=True):
                owners[at], ttls[at] = owner, ttl
            for at, (members, found) in zip(at_readers, read.readers, strict=True):
                # Each shard's expiries are on its own clock: kept as ms left (now 0).
                if isinstance(members, list):
                    members = [(token, float(expiry) - read.now_ms) for token, expiry in members]
                sets[at] = (members, found)
        return _Read(owners=owners, ttls=ttls, readers=sets, now_ms=0)

    def _shard(self, slot: int) -> int | None:
        master = self.map.master_of(slot)
        return None if master is None else self.index.get(master)


class _Forms:
    """The listing's keys (``plain`` lock keys, ``readers`` sets) in cluster form, and the
    slot of each: what every cluster node of the listing reads them by."""

    def __init__(self, plain: list[bytes], readers: list[bytes]) -> None:
        self.plain = [_cluster_bytes(key) for key in plain]
        self.plain_slots = [key_slot(key) for key in self.plain]
        self.readers = [_cluster_bytes(key) for key in readers]
        self.reader_slots = [key_slot(key) for key in self.readers]


def _cluster_bytes(key: bytes) -> bytes:
    return cluster_key(key.decode("utf-8", "surrogateescape")).encode("utf-8", "surrogateescape")


def plain_key(key: bytes, key_prefix: str) -> bytes | None:
    """The plain form of lock key ``key`` as a cluster node stores it (``{<base>}<rest>``,
    or the key itself when its base has a hash tag: :func:`~django_redlock.wire.cluster.
    cluster_key`), or None when it is not a key of ``key_prefix``. With an empty prefix, a
    name that is a whole tag (``{x}``) reads as ``x`` (cluster_key's one ambiguity)."""
    prefix = key_prefix.encode()
    if key.startswith(b"{" + prefix):
        cut = key.find(b"\x00")
        head, rest = (key, b"") if cut < 0 else (key[:cut], key[cut:])
        if head.endswith(b"}") and hash_tag(head[1:-1]) is None:
            return head[1:-1] + rest
    if prefix and key.startswith(prefix):
        return key
    return None


def _literal_prefix(pattern: str) -> bytes | None:
    """The text a SCAN MATCH glob of this module matches at the start of a key when it is
    that text (escaped) and one final ``*``, else None."""
    out = []
    at = 0
    while at < len(pattern) - 1:
        char = pattern[at]
        if char == "\\":
            out.append(pattern[at + 1 : at + 2])
            at += 2
            continue
        if char in "*?[":
            return None
        out.append(char)
        at += 1
    return "".join(out).encode() if pattern.endswith("*") and at == len(pattern) - 1 else None


def _glob_regex(pattern: str) -> bytes:
    """The regular expression of SCAN MATCH glob ``pattern`` as this module writes them
    (escapes, ``*``, ``[xX]`` classes), on bytes."""
    out = []
    at = 0
    data = pattern.encode()
    while at < len(data):
        char = data[at : at + 1]
        if char == b"\\":
            out.append(re.escape(data[at + 1 : at + 2]))
            at += 2
            continue
        if char == b"*":
            out.append(b".*")
        elif char == b"[":
            end = data.index(b"]", at)
            out.append(data[at : end + 1])
            at = end + 1
            continue
        else:
            out.append(re.escape(char))
        at += 1
    return b"".join(out) + b"\\Z"


def _view(
    address: NodeAddress, client: redis.Redis, timeout: float, stack: contextlib.ExitStack
) -> _Plain | _Cluster | None:
    """Node ``address`` as the listing reads it: plain, or a cluster (one client per shard
    master, opened in ``stack``, by the slot map its members give now); None when it could
    not be told (unreachable). A node this process has not classified yet is asked on
    ``client`` (``INFO cluster``)."""
    found, slot_map = known(address)
    if found and slot_map is None:
        return _Plain(client)
    if not found:
        try:
            if not int(client.info("cluster").get("cluster_enabled", 0)):
                remember(address, None)
                return _Plain(client)
        except (redis.RedisError, ValueError):
            return None
    try:
        slot_map = current_map(address, timeout)
    except NodeError:
        return None
    if slot_map is None:
        return _Plain(client)
    route = ClusterRoute(address, slot_map)
    shards = []
    for shard in slot_map.shards:
        tag = route.tag_of(shard.master) or ""
        shards.append((stack.enter_context(client_for(route.member(shard.master), timeout)), tag))
    return _Cluster(shards, slot_map)


@dataclass
class _Read:
    """What one node said about the listing's keys."""

    owners: list[bytes | None]  # per plain key (lock, write lease, slot): owner JSON
    ttls: list[int]  # per plain key: PTTL in ms (-2: absent)
    # Per reader set: its members (token, expiry ms) and owners (token -> JSON), or the
    # error a node answered for either (a key of another type).
    readers: list[tuple[Any, Any]]
    now_ms: int | None  # the node's clock (readers' expiries are on it)


def _read(
    client: redis.Redis, plain: list[bytes], readers: list[bytes], shard: str | None = None
) -> _Read | None:
    """One node's answers about ``plain`` keys (owner and ms left, by ``listing.lua``) and
    ``readers`` sets (members and owners), in one pipeline; None when it could not be read
    (also when its ACL user may not run scripts: such a node cannot hold locks either).

    ``shard``: the records' tag of the cluster shard ``client`` reaches (the keys, then in
    their cluster form, are read by ``listing_shard.lua``'s variant for that shard)."""
    try:
        pipe = client.pipeline(transaction=False)
        pipe.time()
        script = LISTING if shard is None else LISTING_SHARD.for_shard(shard)
        for index in range(0, len(plain), _BATCH):
            batch = plain[index : index + _BATCH]
            # Cluster shards take the keys as ARGV (no KEYS: one slot per call otherwise).
            counted = 0 if shard is not None else len(batch)
            # The first call is an EVAL, which also caches the script on the node, so the
            # rest of the same pipeline can be EVALSHA without a NOSCRIPT round trip.
            if index == 0:
                pipe.eval(script.source.decode(), counted, *batch)
            else:
                pipe.evalsha(script.sha.decode(), counted, *batch)
        for key in readers:
            owners_key = key[: -len(READERS_SUFFIX)] + OWNERS_SUFFIX  # the same form
            pipe.zrange(key, 0, -1, withscores=True)
            pipe.hgetall(owners_key)
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
