"""Is each node sound, does it vote, and can a quorum: :func:`status` (``manage.py
redlock_status``, the admin page, ``manager.status()``); and :func:`declare_fresh` for a
brand-new node. Imports no Django.

Every node is asked through a redis-py client that never retries and waits at most
``timeout`` seconds per command, so a stopped node costs one timeout and never hangs the
report.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

import redis

from django_redlock.core.fanout import LockNodes, each_node
from django_redlock.core.witness import record_votes
from django_redlock.exceptions import NODE_HINT, is_restarted
from django_redlock.wire.clients import client_for
from django_redlock.wire.cluster import SLOTS, Shard, SlotMap, key_slot, marker_tag
from django_redlock.wire.cluster_route import (
    ClusterRoute,
    current_map,
    known,
    read_map,
    remember,
)
from django_redlock.wire.errors import NodeError
from django_redlock.wire.nodes import NodeAddress
from django_redlock.wire.scripts import DECLARE_FRESH, HOLDER, NODE_KEY, NODE_STATE
from django_redlock.wire.sentinel import cached, forget
from django_redlock.wire.setup import persistence_hint, quarantine_of

__all__ = ["Declaration", "NodeStatus", "Report", "ShardStatus", "declare_fresh", "status"]


@dataclass(frozen=True)
class ShardStatus:
    """One shard of a cluster node, as :func:`status` judged its master: a shard votes by
    its own rule (its own restart marker: a shard that restarted or failed over is
    quarantined alone). Fields as :class:`NodeStatus`'s; ``master`` is its ``host:port``,
    ``slots`` the slot ranges it serves (``"0-5460"``, ranges joined by ``,``)."""

    master: str
    slots: str
    reachable: bool
    role: str | None = None
    replicas: list[str] = field(default_factory=list)
    promoted: bool = False
    run_id: str | None = None
    uptime_s: int | None = None
    quarantine_left_s: float | None = None
    vote: str = "down"
    vote_detail: str = ""
    votes_at: float | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def votes(self) -> bool:
        """Whether the shard's master can vote for the locks of its slots right now."""
        return self.reachable and not self.problems and self.vote == "votes"


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
    replicas: list[str] = field(default_factory=list)
    """Each replica of the node as ``host:port (state, lag N s)`` (INFO replication)."""
    master: str | None = None
    """For a replica: its master's ``host:port``."""
    promoted: bool = False
    """A replica promoted to master in this server process's life (``second_repl_offset``):
    it waits the quarantine from its promotion (``scripts/node_rule.lua``)."""
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
    misconfigured: bool = False
    """The node answered and refused (``problems`` says what): waiting will not fix it."""
    service: str | None = None
    """For a node reached through Sentinel: the service name its Sentinels monitor."""
    resolved: str | None = None
    """For a node reached through Sentinel: the master's ``host:port`` they told (None when
    none answered)."""
    shards: list[ShardStatus] = field(default_factory=list)
    """For a cluster node: each shard, judged alone (empty for a plain node). The node
    votes when every shard does: each lock's vote there is its slot's shard's."""

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
    quarantine_ms: int = 0
    """The restart quarantine the verdicts used: the manager's, or a longer one a node
    reported (milliseconds)."""

    @property
    def healthy(self) -> bool:
        return self.voting >= self.quorum

    @property
    def misconfigured(self) -> list[NodeStatus]:
        """Nodes that answered but can never vote as configured (a login or db refused, a
        replica, an ACL without the scripts, the same server twice): they do not heal by
        waiting, so ``redlock_status`` fails on them even while a quorum votes. A node that
        does not answer at all is down, not misconfigured (it may come back)."""
        return [node for node in self.nodes if node.problems and node.misconfigured]

    def as_dict(self) -> dict[str, Any]:
        return {
            "healthy": self.healthy,
            "quorum": self.quorum,
            "voting": self.voting,
            "nodes": [
                {
                    **asdict(node),
                    "votes": node.votes,
                    "shards": [{**asdict(shard), "votes": shard.votes} for shard in node.shards],
                }
                for node in self.nodes
            ],
        }


def _scripts_denied(client: redis.Redis, prefix: str, probe_key: str = "") -> str | None:
    """Why this connection's user may not run the lock scripts on keys under ``prefix``
    (an ACL without EVALSHA/EVAL, or without those keys), or None when it may.

    Runs the read-only holder script on a key no lock uses: EVALSHA first (NOSCRIPT means it
    is allowed but not loaded yet), then EVAL, which the library falls back to.
    """
    probe_key = probe_key or prefix + "\x00acl-probe"
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


def _node_rule(
    client: redis.Redis, quarantine_ms: int, persistence: str, shard: str = ""
) -> tuple[str, str, float]:
    """The node's verdict by ``scripts/node_rule.lua``, the rule the acquire script applies:
    ("votes", why, 0) or ("quarantined", the refusal text, seconds until it votes or -1).
    ``shard``: the records' tag of the cluster shard ``client`` reaches (its own marker)."""
    script = NODE_STATE.for_shard(shard) if shard else NODE_STATE
    verdict, detail, left, _ = _run_script(
        client, script, (marker_key(shard),), (quarantine_ms, persistence)
    )
    return verdict.decode(), detail.decode(errors="replace"), int(left) / 1000


def _run_script(client: redis.Redis, script: Any, keys: Sequence[str], args: Sequence[Any]) -> Any:
    """EVALSHA, or EVAL when the node does not have the script yet."""
    try:
        return client.evalsha(script.sha.decode(), len(keys), *keys, *args)
    except redis.exceptions.NoScriptError:
        return client.eval(script.source.decode(), len(keys), *keys, *args)


def marker_key(shard: str = "") -> str:
    """The restart marker's key: the node's, or on a cluster the shard's whose records carry
    tag ``shard`` (:func:`~django_redlock.wire.cluster.marker_tag`)."""
    return f"{NODE_KEY}{{{shard}}}" if shard else NODE_KEY


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


@dataclass(frozen=True)
class _Down:
    """Why a node could not be read; ``refused``: it answered with an error (misconfigured)
    rather than not answering (down)."""

    reason: str
    refused: bool = False


_CONNECT_FAILED = re.compile(r"^Error (-?\d+) connecting to .+?\. (.+?)\.?$")


def unreachable(exc: redis.RedisError, timeout: float) -> str:
    """Why a node could not be read, in the words the acquire errors use (the line that shows
    it already names the node, so redis-py's address and errno are left out).

    ``timeout``: the seconds each command had. Returns e.g. "connection refused (nothing
    listens at this address)" or "no answer within 250 ms (stopped, paused or unreachable)".
    """
    text = str(exc)
    if isinstance(exc, redis.TimeoutError):
        return f"no answer within {timeout * 1000:g} ms (stopped, paused or unreachable)"
    found = _CONNECT_FAILED.match(text)
    if found is None:
        return text or type(exc).__name__
    reason = found[2].lower()
    if found[1] == "111":  # ECONNREFUSED: a TCP port or a socket file nobody listens on
        return f"{reason} (nothing listens at this address)"
    if found[1] == "2":  # ENOENT: a unix socket path with no file
        return f"{reason} (no server's socket at this path)"
    return reason


def _probe_key(prefix: str, shard: Shard) -> str:
    """A key of the ACL probe on cluster ``shard``: in the form of a lock key there
    (``{<prefix>…}``, which the ACL's key patterns must allow) and in a slot the shard
    serves (a probe elsewhere would be answered MOVED)."""
    for number in range(100_000):
        key = f"{{{prefix}\x00acl-probe-{number}}}"
        slot = key_slot(key)
        if any(low <= slot <= high for low, high in shard.ranges):
            return key
    return prefix + "\x00acl-probe"  # not reached: every range holds some such slot


def _look(
    address: NodeAddress, manager: LockNodes, timeout: float, shard: Shard | None = None
) -> _Seen | _Down | SlotMap:
    """:func:`_look_at`; a configured node known as a cluster whose member the URL names
    does not answer (a master that failed over) is judged by the map its other members give
    (see :func:`~django_redlock.wire.cluster_route.current_map`)."""
    look = _look_at(address, manager, timeout, shard)
    if shard is None and isinstance(look, _Down) and known(address)[1] is not None:
        with contextlib.suppress(NodeError):
            slot_map = current_map(address, timeout)
            if slot_map is not None:
                return slot_map
    return look


def _look_at(
    address: NodeAddress, manager: LockNodes, timeout: float, shard: Shard | None = None
) -> _Seen | _Down | SlotMap:
    """First pass: the node's INFO, clock, persistence and longest quarantine, or why it
    could not be read; for a configured node that is a cluster member (its INFO says so),
    its slot map instead (each shard master is then looked at, ``shard`` saying which)."""
    tag = "" if shard is None else marker_tag(shard)
    try:
        with client_for(address, timeout) as client:
            started = time.perf_counter()
            client.ping()
            latency = (time.perf_counter() - started) * 1000
            info = client.info()
            if shard is None and int(info.get("cluster_enabled", 0) or 0):
                slot_map = read_map(client, address.host or "127.0.0.1")
                remember(address, slot_map)  # what the transport would learn
                return slot_map
            local_before = time.time()
            seconds, micros = client.time()
            local_after = time.time()
            persistence = _persistence(client)
            stored = client.hget(marker_key(tag), "q")
            probe_key = "" if shard is None else _probe_key(manager.key_prefix, shard)
            denied = _scripts_denied(client, manager.key_prefix, probe_key)
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        # A Sentinel node's master may have moved: the next look asks the Sentinels again
        # (a long-lived process that shows the page but takes no lock would keep it forever).
        forget(address)
        return _Down(unreachable(exc, timeout))
    except redis.RedisError as exc:
        # It answered, with a refusal (AUTH, SELECT: "DB index is out of range", an ACL).
        return _Down(str(exc) or type(exc).__name__, refused=True)
    offset = (seconds + micros / 1e6 - (local_before + local_after) / 2) * 1000
    return _Seen(info, latency, offset, persistence, quarantine_of(stored), denied)


def _judge(
    address: NodeAddress,
    seen: _Seen | _Down,
    quarantine_ms: int,
    timeout: float,
    shard: str = "",
) -> NodeStatus:
    """Second pass: the node's verdict by the acquire script's own rule, and its warnings.
    ``shard``: as for :func:`_node_rule`."""
    label = address.label
    where = _sentinel_fields(address)
    if isinstance(seen, _Down):
        return NodeStatus(
            node=label,
            reachable=False,
            vote="down",
            problems=[seen.reason],
            misconfigured=seen.refused,
            **where,
        )
    info = seen.info
    problems: list[str] = []
    if seen.denied:
        problems.append(seen.denied)
    warnings: list[str] = []
    role = str(info.get("role", "unknown"))
    replicas = _replicas(info)
    master = None
    if role != "master":
        # The Sentinels named a replica (one of them has not seen a failover): asked again,
        # that one last, at the next look.
        forget(address, stale=True)
        master = f"{info.get('master_host', '?')}:{info.get('master_port', '?')}"
        problems.append(
            f"a replica (of {master}): it never votes; list its master as the node, or its "
            "Sentinels"
            if address.sentinel is None
            else f"the Sentinels named a replica (of {master}): one of them has not seen a "
            "failover yet; the next look asks the others first"
        )
    elif replicas:
        warnings.append(
            f"{len(replicas)} replica{'s' if len(replicas) != 1 else ''} "
            f"({', '.join(replicas)}): after a failover the promoted one waits "
            f"{quarantine_ms / 1000:g} s before it votes (it may lack the last locks)"
        )
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
                vote, detail, left = _node_rule(client, quarantine_ms, seen.persistence, shard)
        except redis.RedisError as exc:
            return NodeStatus(
                node=label, reachable=False, problems=[unreachable(exc, timeout)], **where
            )
    server = "valkey" if "valkey_version" in info else "redis"
    return NodeStatus(
        node=label,
        reachable=True,
        latency_ms=round(seen.latency, 3),
        server=server,
        version=str(info.get("valkey_version") or info.get("redis_version") or ""),
        role=role,
        replicas=replicas,
        master=master,
        promoted=role == "master" and int(info.get("second_repl_offset", -1) or -1) >= 0,
        run_id=str(info.get("run_id", "")),
        uptime_s=int(info.get("uptime_in_seconds", 0) or 0),
        maxmemory=maxmemory,
        maxmemory_policy=policy,
        persistence=_PERSISTENCE_SHOWN.get(seen.persistence, seen.persistence),
        clock_offset_ms=round(seen.offset, 1),
        quarantine_left_s=round(left, 3) if vote == "quarantined" else 0.0,
        votes_at=time.time() + left if vote == "quarantined" and left >= 0 else None,
        vote=vote,
        # A refusal with what to do about it: the one command safe to run as printed.
        vote_detail=(
            f"votes ({detail})"
            if vote != "quarantined"
            else f"{detail}; {NODE_HINT}"
            if is_restarted(detail)
            else detail
        ),
        problems=problems,
        warnings=warnings,
        misconfigured=bool(problems),
        **where,
    )


def _sentinel_fields(address: NodeAddress) -> dict[str, Any]:
    """``service`` and ``resolved`` for a node reached through Sentinel (none otherwise):
    the master its Sentinels told when this status connected (:func:`_look`)."""
    if address.sentinel is None:
        return {}
    master = cached(address)
    return {
        "service": address.sentinel.service,
        "resolved": None if master is None else f"{master[0]}:{master[1]}",
    }


def _replicas(info: dict[str, Any]) -> list[str]:
    """The replicas INFO replication lists (``slave0``, ``slave1``, ...: redis-py parses each
    into a dict), as ``host:port (state, lag N s)``."""
    found = []
    for index in range(int(info.get("connected_slaves", 0) or 0)):
        entry = info.get(f"slave{index}")
        if isinstance(entry, dict):
            found.append(
                f"{entry.get('ip', '?')}:{entry.get('port', '?')} "
                f"({entry.get('state', '?')}, lag {entry.get('lag', '?')} s)"
            )
    return found


def status(manager: LockNodes, *, timeout: float = 0.25, record: bool = True) -> Report:
    """Probe every node at once (bounded by ``timeout`` per command) and judge the quorum.

    Each node's verdict comes from the rule the acquire script applies, with the longest
    quarantine any node reports (as a manager that contacts them uses). With ``record``, the
    nodes that vote are recorded on the others (best effort, see ``core/witness.py``).
    """
    addresses = manager.addresses
    first = each_node(addresses, lambda address: _look(address, manager, timeout, None))
    # Every server judged: a plain node, or each shard master of a cluster node (looked at
    # in a second pass, all at once: a plain node costs nothing more).
    kinds: list[SlotMap | None] = []
    members: list[tuple[int, NodeAddress, str, Shard | None]] = []
    for index, (address, look) in enumerate(zip(addresses, first, strict=True)):
        if not isinstance(look, SlotMap):
            kinds.append(None)
            members.append((index, address, "", None))
            continue
        kinds.append(look)
        route = ClusterRoute(address, look)
        for shard in look.shards:
            tag = route.tag_of(shard.master) or ""
            members.append((index, route.member(shard.master), tag, shard))
    shards = each_node(
        [member for member in members if member[3] is not None],
        lambda member: _look(member[1], manager, timeout, member[3]),
    )
    found = iter(shards)
    seen: list[_Seen | _Down] = []
    for index, _, _, part in members:
        look = next(found) if part is not None else first[index]
        # A shard master's look never gives a map (only a configured node's does).
        if isinstance(look, SlotMap):
            look = _Down("a cluster member, not a shard master")
        seen.append(look)
    quarantine = max(
        [manager.quarantine_ms, *(item.quarantine_ms for item in seen if isinstance(item, _Seen))]
    )
    judged = each_node(
        list(zip(members, seen, strict=True)),
        lambda pair: _judge(pair[0][1], pair[1], quarantine, timeout, pair[0][2]),
    )
    nodes = []
    for index, (address, slot_map) in enumerate(zip(addresses, kinds, strict=True)):
        mine = [
            (member[3], node)
            for member, node in zip(members, judged, strict=True)
            if member[0] == index
        ]
        if slot_map is None:
            nodes.append(mine[0][1])
        else:
            nodes.append(_cluster_status(address, slot_map, mine))
    by_run_id: dict[str, str] = {}
    for node in nodes:
        if node.run_id:
            if node.run_id in by_run_id:
                node.problems.append(
                    f"same server as {by_run_id[node.run_id]} (run_id): not an independent node"
                )
                object.__setattr__(node, "misconfigured", True)  # frozen; built just above
            by_run_id.setdefault(node.run_id, node.node)
    voting = sum(1 for node in nodes if node.votes)
    if record:
        # What a status saw vote, remembered by the other nodes (core/witness.py): an
        # operator's health checks keep the records that redlock_declare_fresh reads. Only
        # on the nodes that answered: a stalled one would cost the report another timeout.
        record_votes(
            [address for address, node in zip(addresses, nodes, strict=True) if node.reachable],
            {
                address: node.run_id or ""
                for address, node in zip(addresses, nodes, strict=True)
                if node.votes
            },
            timeout=timeout,
        )
    return Report(nodes=nodes, quorum=manager.quorum, voting=voting, quarantine_ms=quarantine)


def _unserved(slot_map: SlotMap) -> str:
    """The slot ranges no shard of ``slot_map`` serves (``"0-5460,…"``), or ""."""
    gaps = []
    nxt = 0
    for low, high in sorted(r for shard in slot_map.shards for r in shard.ranges):
        if low > nxt:
            gaps.append((nxt, low - 1))
        nxt = max(nxt, high + 1)
    if nxt < SLOTS:
        gaps.append((nxt, SLOTS - 1))
    return ",".join(f"{low}-{high}" if high != low else str(low) for low, high in gaps)


def _slots_text(shard: Shard) -> str:
    return ",".join(f"{low}-{high}" if high != low else str(low) for low, high in shard.ranges)


def _cluster_status(
    address: NodeAddress, slot_map: SlotMap, shards: list[tuple[Shard | None, NodeStatus]]
) -> NodeStatus:
    """Cluster node ``address``'s status from each shard master's (``shards``): it votes
    when every shard does (a lock's vote there is its slot's shard's), is quarantined when a
    shard is (until the last one votes again), and down when a shard is."""
    # In slot order (CLUSTER SHARDS lists them in no set order).
    shards = sorted(shards, key=lambda pair: pair[0].ranges if pair[0] is not None else ())
    parts = []
    for shard, node in shards:
        assert shard is not None
        parts.append(
            ShardStatus(
                master=f"{shard.master[0]}:{shard.master[1]}",
                slots=_slots_text(shard),
                reachable=node.reachable,
                role=node.role,
                replicas=node.replicas,
                promoted=node.promoted,
                run_id=node.run_id,
                uptime_s=node.uptime_s,
                quarantine_left_s=node.quarantine_left_s,
                vote=node.vote,
                vote_detail=node.vote_detail,
                votes_at=node.votes_at,
                problems=node.problems,
            )
        )
    statuses = [node for _, node in shards]
    up = [node for node in statuses if node.reachable]
    problems = [
        f"shard {part.master} (slots {part.slots}): {problem}"
        for part in parts
        for problem in part.problems
    ]
    orphans = _unserved(slot_map)
    if orphans:
        # A shard whose master failed and no replica took over: its locks get no vote here.
        problems.append(f"slots {orphans} have no master online (a shard down, not failed over)")
    # A warning every shard has (no aof, say) is said once.
    warned: dict[str, list[str]] = {}
    for part, node in zip(parts, statuses, strict=True):
        for warning in node.warnings:
            warned.setdefault(warning, []).append(part.master)
    warnings = [
        f"every shard: {warning}"
        if len(masters) == len(parts) > 1
        else f"shard {', '.join(masters)}: {warning}"
        for warning, masters in warned.items()
    ]
    quarantined = [part for part in parts if part.vote == "quarantined"]
    if len(up) < len(statuses) or not statuses or orphans:
        vote = "down"
    elif quarantined:
        vote = "quarantined"
    else:
        vote = statuses[0].vote if all(node.vote == "votes" for node in statuses) else "down"
    votes_at = None
    if quarantined and all(part.votes_at is not None for part in quarantined):
        votes_at = max(part.votes_at for part in quarantined if part.votes_at is not None)
    detail = (
        f"votes (every shard of {len(parts)} votes)"
        if vote == "votes"
        else "; ".join(
            f"shard {part.master} (slots {part.slots}): {part.vote_detail}" for part in quarantined
        )
    )
    first = up[0] if up else None
    lefts = [part.quarantine_left_s or 0.0 for part in quarantined]
    return NodeStatus(
        node=address.label,
        reachable=bool(statuses) and len(up) == len(statuses) and not orphans,
        latency_ms=max((node.latency_ms or 0.0 for node in up), default=None),
        server=None if first is None else first.server,
        version=None if first is None else first.version,
        role=f"cluster of {len(parts)} shard{'s' if len(parts) != 1 else ''}",
        replicas=[replica for part in parts for replica in part.replicas],
        run_id=",".join(sorted(part.run_id for part in parts if part.run_id)) or None,
        uptime_s=min((node.uptime_s or 0 for node in up), default=None),
        persistence=None if first is None else first.persistence,
        clock_offset_ms=max((node.clock_offset_ms or 0.0 for node in up), key=abs, default=None),
        quarantine_left_s=(-1.0 if -1.0 in lefts else max(lefts)) if lefts else 0.0,
        vote=vote,
        vote_detail=detail,
        votes_at=votes_at,
        problems=problems,
        warnings=warnings,
        misconfigured=any(node.misconfigured for node in statuses),
        shards=parts,
    )


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
    try:
        slot_map = current_map(address, timeout)  # a status has classified it, as a rule
    except NodeError:
        slot_map = None  # not reached: the declaration below says why
    if slot_map is not None:
        return _declare_shards(address, slot_map, timeout)
    label = address.label
    try:
        with client_for(address, timeout) as client:
            info = client.info("server")
            run_id = str(info.get("run_id", ""))
            uptime = int(info.get("uptime_in_seconds", 0) or 0)
            _run_script(client, DECLARE_FRESH, (NODE_KEY,), (run_id,))
    except redis.RedisError as exc:
        return Declaration(label, False, detail=f"not declared: {unreachable(exc, timeout)}")
    return Declaration(
        label,
        True,
        run_id,
        uptime,
        f"declared fresh: process {run_id[:8]} (up {uptime} s) votes at once; "
        "any restart of it is judged again",
    )


def _declare_shards(address: NodeAddress, slot_map: SlotMap, timeout: float) -> Declaration:
    """:func:`_declare` on a cluster node: every shard's current master process, each in
    its shard's own marker (as unconditional as a plain node's declaration: the command
    decides first). Declared when every shard was."""
    route = ClusterRoute(address, slot_map)
    done: list[str] = []
    failed: list[str] = []
    run_ids: list[str] = []
    uptimes: list[int] = []
    for shard in slot_map.shards:
        tag = route.tag_of(shard.master) or ""
        where = f"shard {shard.master[0]}:{shard.master[1]} (slots {_slots_text(shard)})"
        try:
            with client_for(route.member(shard.master), timeout) as client:
                info = client.info()
                run_id = str(info.get("run_id", ""))
                uptime = int(info.get("uptime_in_seconds", 0) or 0)
                if info.get("role") != "master":
                    failed.append(f"{where}: a replica now (the map is out of date)")
                    continue
                script = DECLARE_FRESH.for_shard(tag)
                _run_script(client, script, (marker_key(tag),), (run_id,))
                done.append(f"{where}: process {run_id[:8]} (up {uptime} s)")
        except redis.RedisError as exc:
            failed.append(f"{where}: {unreachable(exc, timeout)}")
            continue
        run_ids.append(run_id)
        uptimes.append(uptime)
    if failed:
        return Declaration(address.label, False, detail="not declared: " + "; ".join(failed))
    if not done:
        return Declaration(address.label, False, detail="not declared: no shard serves a slot")
    return Declaration(
        address.label,
        True,
        ",".join(sorted(run_ids)),
        min(uptimes),
        "declared fresh, each shard's process votes at once: "
        + "; ".join(done)
        + "; any restart of them is judged again",
    )


def declare_fresh(
    addresses: Sequence[NodeAddress],
    *,
    timeout: float = 1.0,
    peers: Sequence[NodeAddress] = (),
) -> list[Declaration]:
    """Declare the current server process of each node fresh: it votes at once, with no
    restart quarantine, until it restarts (the declaration names its run_id, see
    ``scripts/declare_fresh.lua``). All nodes at once; never raises for node failures.

    Each declared process is recorded as seen voting on the other nodes (``addresses`` and
    ``peers``, see ``core/witness.py``) before this returns, so a later crash of it is never
    taken for a brand-new node.

    Unconditional: only for brand-new nodes or nodes shut down cleanly with their data (on a
    node that lost locks whose leases still run, it allows a double grant).
    ``redlock_declare_fresh`` checks first (:func:`~django_redlock.core.witness.assess`).
    """
    done = each_node(list(addresses), lambda address: _declare(address, timeout))
    everyone = list(dict.fromkeys([*addresses, *peers]))
    declared = {
        address: item.run_id or ""
        for address, item in zip(addresses, done, strict=True)
        if item.declared
    }
    if declared and len(everyone) > 1:
        record_votes(everyone, declared, timeout=timeout)
    return done
