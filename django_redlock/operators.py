"""What operators ask: which locks are held, by whom, on which nodes, and is each node sound.

Used by ``manage.py redlock_status`` and the admin page; imports no Django. Every node is
asked through a redis-py client that never retries and waits at most ``timeout`` seconds per
command, so a stopped node costs one timeout and never hangs the report. Keys are found with
``SCAN`` (never ``KEYS``), paged and capped; glob characters in the prefix are escaped.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import redis

from django_redlock.health import client_for
from django_redlock.redlock import _HOLDER, EPOCH_KEY

if TYPE_CHECKING:
    from django_redlock.redlock import LockManager

__all__ = ["LockInfo", "LockListing", "NodeStatus", "Report", "list_locks", "status"]

_GLOB = str.maketrans({char: "\\" + char for char in "*?[]\\"})


def escape_glob(text: str) -> str:
    """``text`` with the SCAN MATCH glob characters escaped (``job*`` matches only itself)."""
    return text.translate(_GLOB)


@dataclass(frozen=True)
class LockInfo:
    """One lock as seen across the nodes.

    Attributes:
        name: the lock name (the key without the prefix).
        nodes: how many nodes hold a key for it.
        total: how many nodes were asked.
        partial: held on fewer than a quorum: a leftover (a failed acquire's key, or a lease
            that expired elsewhere), not a lock anyone holds.
        ttl_min, ttl_max: remaining seconds of its keys (None when unknown).
        owner: the owner metadata found on most nodes (host, pid, thread, task, origin,
            acquired_at); never the token.
    """

    name: str
    nodes: int
    total: int
    partial: bool
    ttl_min: float | None
    ttl_max: float | None
    owner: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class LockListing:
    """The locks found, and whether the listing stopped at its cap."""

    locks: list[LockInfo]
    truncated: bool
    unreachable: list[str]


def list_locks(
    manager: LockManager, prefix: str = "", *, limit: int = 1000, timeout: float = 0.25
) -> LockListing:
    """Every lock whose name starts with ``prefix``, merged across the nodes.

    At most ``limit`` keys are read per node and ``limit`` locks returned (``truncated`` says
    when more exist).
    """
    pattern = escape_glob(manager.key_prefix + prefix) + "*"
    start = len(manager.key_prefix)
    seen: dict[str, list[tuple[str | None, int]]] = {}
    truncated = False
    unreachable: list[str] = []
    for address in manager.addresses:
        try:
            with client_for(address, timeout) as client:
                keys: list[bytes] = []
                for key in client.scan_iter(match=pattern, count=200):
                    if b"\x00" in key:  # wait lines, lapse times, the epoch marker
                        continue
                    if len(keys) >= limit:
                        truncated = True
                        break
                    keys.append(key)
                pipe = client.pipeline(transaction=False)
                for key in keys:
                    pipe.hget(key, "o")
                    pipe.pttl(key)
                replies = pipe.execute(raise_on_error=False)
        except redis.RedisError:
            unreachable.append(address.label)
            continue
        for index, key in enumerate(keys):
            owner, pttl = replies[2 * index], replies[2 * index + 1]
            raw = owner.decode("utf-8", "replace") if isinstance(owner, bytes) else None
            ttl = pttl if isinstance(pttl, int) else -2
            if ttl == -2:
                continue  # expired between SCAN and the read
            name = key.decode("utf-8", "replace")[start:]
            seen.setdefault(name, []).append((raw, ttl))
    locks = [_merge(name, found, manager) for name, found in sorted(seen.items())]
    if len(locks) > limit:  # each node stopped at `limit`, but at different names
        locks, truncated = locks[:limit], True
    return LockListing(locks=locks, truncated=truncated, unreachable=unreachable)


def _merge(name: str, found: list[tuple[str | None, int]], manager: LockManager) -> LockInfo:
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
    )


@dataclass(frozen=True)
class NodeStatus:
    """One node's health for operators; ``problems`` are errors, ``warnings`` are not."""

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
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def votes(self) -> bool:
        """Whether this node can vote for a lock right now."""
        return self.reachable and not self.problems and not self.quarantine_left_s


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
                client.evalsha(_HOLDER.sha.decode(), 1, probe_key)
            else:
                client.eval(_HOLDER.source.decode(), 1, probe_key)
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


def _probe(address: Any, manager: LockManager, timeout: float) -> NodeStatus:
    label = address.label
    try:
        with client_for(address, timeout) as client:
            started = time.perf_counter()
            client.ping()
            latency = (time.perf_counter() - started) * 1000
            info = client.info()
            local_before = time.time()
            seconds, micros = client.time()
            local_after = time.time()
            marker = client.get(EPOCH_KEY)
            try:
                fsync = client.config_get("appendfsync").get("appendfsync")
            except redis.RedisError:  # CONFIG is often denied by ACLs
                fsync = None
            denied = _scripts_denied(client, manager.key_prefix)
    except redis.RedisError as exc:
        return NodeStatus(node=label, reachable=False, problems=[str(exc) or type(exc).__name__])

    problems: list[str] = []
    if denied:
        problems.append(denied)
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
    aof = bool(int(info.get("aof_enabled", 0) or 0))
    persistence = f"aof, appendfsync {fsync or 'unknown'}" if aof else "no aof"
    if persistence != "aof, appendfsync always":
        warnings.append(
            "restarts lose its locks: after one it is quarantined for max_ttl "
            f"({manager.max_ttl:g} s) before it votes again"
        )
    node_now = seconds + micros / 1e6
    offset = (node_now - (local_before + local_after) / 2) * 1000
    if abs(offset) > 500:
        warnings.append(f"clock differs from this host's by {offset:.0f} ms")
    quarantine: float | None = None
    if marker is None:
        warnings.append("has no restart marker: its next vote starts a quarantine")
    else:
        age = node_now * 1000 - int(marker)
        left = manager.max_ttl * 1000 - age
        quarantine = max(0.0, left / 1000)
    server = "valkey" if "valkey_version" in info else "redis"
    return NodeStatus(
        node=label,
        reachable=True,
        latency_ms=round(latency, 3),
        server=server,
        version=str(info.get("valkey_version") or info.get("redis_version") or ""),
        role=role,
        run_id=str(info.get("run_id", "")),
        uptime_s=int(info.get("uptime_in_seconds", 0) or 0),
        maxmemory=maxmemory,
        maxmemory_policy=policy,
        persistence=persistence,
        clock_offset_ms=round(offset, 1),
        quarantine_left_s=round(quarantine, 3) if quarantine else 0.0,
        problems=problems,
        warnings=warnings,
    )


def status(manager: LockManager, *, timeout: float = 0.25) -> Report:
    """Probe every node (bounded by ``timeout`` per command) and judge the quorum."""
    nodes = [_probe(address, manager, timeout) for address in manager.addresses]
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
