"""What operators ask: which locks are held, by whom, on which nodes, and is each node sound.

Used by ``manage.py redlock_status`` and the admin page; imports no Django. Every node is
asked through a redis-py client that never retries and waits at most ``timeout`` seconds per
command, so a stopped node costs one timeout and never hangs the report. Keys are found with
``SCAN`` (never ``KEYS``), paged and capped; glob characters in the prefix are escaped.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol, TypeVar

import redis

from django_redlock.wire.clients import client_for
from django_redlock.wire.nodes import NodeAddress
from django_redlock.wire.primitives import READER_OWNERS
from django_redlock.wire.scripts import DECLARE_FRESH, HOLDER, NODE_KEY, NODE_STATE, READERS
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
    """The locks found, and whether the listing stopped at its cap."""

    locks: list[LockInfo]
    truncated: bool
    unreachable: list[str]


# A lease's identity across the nodes: (name, kind, slot or reader). A reader is told apart
# from the others by a digest of its token, which never leaves this module.
_Identity = tuple[str, str, int | str | None]
# One node's answer for one lease: its identity, owner JSON (or None) and ms left.
_Found = tuple[_Identity, str | None, int]

_SLOT = re.compile(rb"^(.*)\x00s(\d+)$", re.DOTALL)


def list_locks(
    manager: LockNodes,
    prefix: str = "",
    *,
    limit: int = 1000,
    timeout: float = 0.25,
    skip: Collection[str] = (),
) -> LockListing:
    """Every held lease whose name starts with ``prefix`` (locks, semaphore slots, readers),
    merged across the nodes (all at once).

    At most ``limit`` keys are read per node and ``limit`` leases returned (``truncated``
    says when more exist). Nodes whose label is in ``skip`` (found down a moment ago) are not
    asked again and count as unreachable.
    """
    pattern = escape_glob(manager.key_prefix + prefix) + "*"
    start = len(manager.key_prefix)
    seen: dict[_Identity, list[tuple[str | None, int]]] = {}
    unreachable: list[str] = []
    scans = _each_node(
        manager.addresses,
        lambda address: (
            None if address.label in skip else _scan(address, pattern, start, limit, timeout)
        ),
    )
    truncated = any(scan[1] for scan in scans if scan is not None)
    for address, scan in zip(manager.addresses, scans, strict=True):
        if scan is None:
            unreachable.append(address.label)
            continue
        for identity, raw, ttl in scan[0]:
            seen.setdefault(identity, []).append((raw, ttl))
    locks = [
        _merge(identity, found, manager)
        for identity, found in sorted(seen.items(), key=lambda item: _order(item[0]))
    ]
    if len(locks) > limit:  # each node stopped at `limit`, but at different names
        locks, truncated = locks[:limit], True
    return LockListing(locks=locks, truncated=truncated, unreachable=unreachable)


def _order(identity: _Identity) -> tuple[str, str, int, str]:
    name, kind, which = identity
    return (name, kind, which if isinstance(which, int) else -1, str(which or ""))


def _scan(
    address: NodeAddress, pattern: str, start: int, limit: int, timeout: float
) -> tuple[list[_Found], bool] | None:
    """One node's leases under keys matching ``pattern`` (at most ``limit`` keys): each
    lease's identity, owner and ms left; and whether more keys were left. None when the
    node could not be read. ``start``: the length of the key prefix."""
    locks: list[tuple[bytes, str, int | None]] = []  # key, kind, slot
    readers: list[bytes] = []
    truncated = False
    try:
        with client_for(address, timeout) as client:
            for key in client.scan_iter(match=pattern, count=200):
                if b"\x00" in key:
                    slot = _SLOT.match(key)
                    if slot is not None:
                        entry: tuple[bytes, str, int | None] = (key, "semaphore", int(slot[2]))
                    elif key.endswith(READERS_SUFFIX):
                        entry = (key, "read", None)
                    else:  # wait lines, lapse times, reader owners, the node marker
                        continue
                else:
                    entry = (key, "lock", None)
                if len(locks) + len(readers) >= limit:
                    truncated = True
                    break
                if entry[1] == "read":
                    readers.append(key)
                else:
                    locks.append(entry)
            pipe = client.pipeline(transaction=False)
            pipe.time()
            for key, _, _ in locks:
                pipe.hget(key, "o")
                pipe.pttl(key)
            for key in readers:
                pipe.zrange(key, 0, -1, withscores=True)
                pipe.hgetall(key[: -len(READERS_SUFFIX)] + OWNERS_SUFFIX)
            replies = pipe.execute(raise_on_error=False)
    except redis.RedisError:
        return None
    found: list[_Found] = []
    clock, replies = replies[0], replies[1:]
    for index, (key, kind, number) in enumerate(locks):
        owner, pttl = replies[2 * index], replies[2 * index + 1]
        ttl = pttl if isinstance(pttl, int) else -2
        if ttl == -2:
            continue  # expired between SCAN and the read
        found.append(((_name(key, start, kind), kind, number), _text(owner), ttl))
    if not isinstance(clock, list | tuple):
        return found, truncated
    now_ms = int(clock[0]) * 1000 + int(clock[1]) // 1000
    replies = replies[2 * len(locks) :]
    for index, key in enumerate(readers):
        members, owners = replies[2 * index], replies[2 * index + 1]
        if not isinstance(members, list) or not isinstance(owners, dict):
            continue
        name = key[: -len(READERS_SUFFIX)].decode("utf-8", "replace")[start:]
        for token, expiry in members:
            left = int(expiry) - now_ms
            if left <= 0:
                continue  # an expired reader, not purged yet
            # The token stays here: a digest tells the same reader apart on every node.
            digest = hashlib.sha256(token).hexdigest()[:16]
            found.append(((name, "read", digest), _text(owners.get(token)), left))
    return found, truncated


READERS_SUFFIX = READERS.encode()
OWNERS_SUFFIX = READER_OWNERS.encode()


def _name(key: bytes, start: int, kind: str) -> str:
    if kind == "semaphore":
        match = _SLOT.match(key)
        assert match is not None
        key = match[1]
    return key.decode("utf-8", "replace")[start:]


def _text(raw: object) -> str | None:
    return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else None


def _merge(
    identity: _Identity, found: list[tuple[str | None, int]], manager: LockNodes
) -> LockInfo:
    name, kind, which = identity
    counts: dict[str, int] = {}
    for raw, _ in found:
        if raw is not None:
            counts[raw] = counts.get(raw, 0) + 1
    owner: dict[str, Any] = {}
    if counts:
        raw = max(counts.items(), key=lambda item: item[1])[0]
        try:
            parsed = json.loads(raw)
        except ValueError:
            parsed = None
        owner = parsed if isinstance(parsed, dict) else {"raw": raw}
    ttls = [ttl / 1000 for _, ttl in found if ttl >= 0]
    return LockInfo(
        name=name,
        nodes=len(found),
        total=len(manager.addresses),
        partial=len(found) < manager.quorum,
        ttl_min=min(ttls) if ttls else None,
        ttl_max=max(ttls) if ttls else None,
        owner=owner,
        kind=kind,
        slot=which if isinstance(which, int) else None,
    )


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
