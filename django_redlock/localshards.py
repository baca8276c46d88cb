"""Local Redis/Valkey Clusters for tests and benchmarks: one lock node made of several shards.

A :class:`LocalShardedNode` starts ``shards`` server processes of the bundled ``valkey-server``
(or ``$REDLOCK_SERVER_BIN``) with ``--cluster-enabled yes``, each on a free TCP port whose
port + 10000 (the cluster bus) is free too, assigns the 16384 slots in even ranges with
``CLUSTER ADDSLOTSRANGE``, joins them with ``CLUSTER MEET`` and waits until every member says
``cluster_state:ok``. With ``replicas=1`` each shard also gets a replica (``CLUSTER
REPLICATE``), for failover tests. Its members are :class:`~django_redlock.localnodes.LocalNode`
objects: each can be paused, killed and restarted as a plain node can (a restarted member
keeps its ``nodes.conf``, so it rejoins the cluster with its slots, its data gone).

    with LocalShardedNode(3) as node:
        manager = LockManager([node.url, ...])

Only processes it started are ever signalled. Imports no Django.
"""

from __future__ import annotations

import shutil
import socket
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import TracebackType

import redis

from django_redlock.localnodes import LocalNode, server_binary
from django_redlock.wire.clients import client_for
from django_redlock.wire.cluster import SLOTS, slot_tag
from django_redlock.wire.nodes import parse_node
from django_redlock.wire.scripts import DECLARE_FRESH, NODE_KEY

__all__ = ["BUS_OFFSET", "LocalShardedNode", "free_port_pair"]

BUS_OFFSET = 10000
"""A cluster member listens on its port + 10000 for the cluster bus (``cluster-port 0``)."""

_FORMED_TIMEOUT = 30.0


def _bindable(port: int) -> socket.socket | None:
    probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        probe.bind(("127.0.0.1", port))
    except OSError:
        probe.close()
        return None
    return probe


def free_port_pair(taken: set[int] | None = None) -> int:
    """A free 127.0.0.1 port whose bus port (+ :data:`BUS_OFFSET`) is free too.

    Both are probed by binding them at once (then released): a member whose bus port is
    taken exits at start with "Address already in use". ``taken``: ports already handed out
    (not yet bound by their server), skipped, and the result added to it.

    Raises:
        RuntimeError: no such pair found in 200 tries.
    """
    taken = set() if taken is None else taken
    for _ in range(200):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind(("127.0.0.1", 0))
            port: int = probe.getsockname()[1]
            if port + BUS_OFFSET > 65535 or port in taken or port + BUS_OFFSET in taken:
                continue
            bus = _bindable(port + BUS_OFFSET)
            if bus is None:
                continue
            bus.close()
        taken.update((port, port + BUS_OFFSET))
        return port
    raise RuntimeError("no free port pair (port, port + 10000) on 127.0.0.1")


def slot_ranges(shards: int) -> list[tuple[int, int]]:
    """The 16384 slots in ``shards`` contiguous, inclusive ranges of (nearly) equal size."""
    bounds = [SLOTS * index // shards for index in range(shards + 1)]
    return [(bounds[index], bounds[index + 1] - 1) for index in range(shards)]


class LocalShardedNode:
    """One lock node that is a Redis/Valkey Cluster of ``shards`` local masters.

    Args:
        shards: how many masters (each owns one range of :func:`slot_ranges`).
        directory: where configs, logs and ``nodes-*.conf`` files go (default: a new
            temporary directory, removed on :meth:`stop`).
        replicas: replicas per master (0 or 1).
        binary: the server executable (default: :func:`~django_redlock.localnodes.server_binary`).
        fresh: declare each master fresh once the cluster is formed, so it votes at once.
        name: a prefix for the members' names (files in ``directory``).
    """

    def __init__(
        self,
        shards: int,
        directory: Path | None = None,
        *,
        replicas: int = 0,
        binary: str | None = None,
        fresh: bool = True,
        name: str = "c",
        extra_args: Sequence[str] = (),
    ) -> None:
        if isinstance(shards, bool) or not isinstance(shards, int):
            raise TypeError(f"shards must be an int, not {type(shards).__name__}")
        if not 1 <= shards <= 64:
            raise ValueError(f"shards must be between 1 and 64, not {shards!r}")
        if replicas not in (0, 1):
            raise ValueError(f"replicas must be 0 or 1, not {replicas!r}")
        self._owns_directory = directory is None
        self.directory = Path(directory or tempfile.mkdtemp(prefix="rlc-", dir="/tmp"))
        self.fresh = fresh
        binary = binary or server_binary()
        taken: set[int] = set()

        def member(label: str) -> LocalNode:
            node = LocalNode(
                self.directory,
                name=f"{name}{label}",
                binary=binary,
                extra_args=(
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    f"nodes-{name}{label}.conf",
                    "--cluster-node-timeout",
                    "2000",
                    # Every member answers for its slots even while another shard is down:
                    # a lock node's shards vote apart (the default stops the whole cluster).
                    "--cluster-require-full-coverage",
                    "no",
                    # A replica's first sync starts at once (the default waits 5 s for more).
                    "--repl-diskless-sync-delay",
                    "0",
                    *extra_args,
                ),
            )
            node.port = free_port_pair(taken)
            return node

        self.masters = [member(f"m{index}") for index in range(shards)]
        self.replicas = [member(f"r{index}") for index in range(shards)] if replicas else []
        self.ranges = slot_ranges(shards)
        self._following: list[LocalNode] = []  # replicas told to follow their master

    @property
    def members(self) -> list[LocalNode]:
        return self.masters + self.replicas

    @property
    def url(self) -> str:
        """The node's URL: its first master's (any member's address reaches the cluster)."""
        return self.masters[0].url

    def __iter__(self) -> Iterator[LocalNode]:
        return iter(self.masters)

    def __len__(self) -> int:
        return len(self.masters)

    def client(self, member: LocalNode, timeout: float = 5.0) -> redis.Redis:
        """A plain redis-py client to one member (no redirection followed)."""
        return client_for(parse_node(member.url), timeout)

    def start(self) -> LocalShardedNode:
        """Start every member, form the cluster and wait for ``cluster_state:ok`` everywhere
        (stopping what it started if any step fails).

        Raises:
            RuntimeError: a member did not start, or the cluster was not formed in 30 s.
        """
        try:
            for member in self.members:
                member.start(fresh=False)  # fresh only once it serves its slots
            self._form()
            if self.fresh:
                self.declare_fresh()
        except BaseException:
            self.stop()
            raise
        return self

    def _form(self) -> None:
        first = self.masters[0]
        for master, (low, high) in zip(self.masters, self.ranges, strict=True):
            with self.client(master) as client:
                client.execute_command("CLUSTER", "ADDSLOTSRANGE", low, high)
        for member in self.members[1:]:
            with self.client(member) as client:
                client.execute_command("CLUSTER", "MEET", "127.0.0.1", first.port)
        self.wait_formed()
        for master, replica in zip(self.masters, self.replicas, strict=False):
            with self.client(master) as client:
                master_id = client.execute_command("CLUSTER", "MYID")
            self._replicate(replica, master_id)
        if self.replicas:
            self.wait_formed()

    def _replicate(self, replica: LocalNode, master_id: bytes | str) -> None:
        # A replica can only follow a master it already knows of: MEET is gossiped, so it may
        # answer "Unknown node" for a moment.
        deadline = time.monotonic() + _FORMED_TIMEOUT
        with self.client(replica) as client:
            while True:
                try:
                    client.execute_command("CLUSTER", "REPLICATE", master_id)
                    self._following.append(replica)
                    return
                except redis.ResponseError:
                    if time.monotonic() > deadline:
                        raise
                time.sleep(0.02)

    def wait_formed(self, timeout: float = _FORMED_TIMEOUT) -> None:
        """Wait until every running member says ``cluster_state:ok`` and knows every member
        (``cluster_known_nodes``), with every slot assigned.

        Raises:
            RuntimeError: not within ``timeout`` seconds (the last answers included).
        """
        deadline = time.monotonic() + timeout
        running = [member for member in self.members if member.running and not member.paused]
        last: dict[str, str] = {}
        while True:
            if all(self._formed(member, last) for member in running):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"cluster not formed in {timeout} s: {last}")
            time.sleep(0.02)

    def _formed(self, member: LocalNode, last: dict[str, str]) -> bool:
        try:
            with self.client(member, 1.0) as client:
                info = client.execute_command("CLUSTER", "INFO")
        except redis.RedisError as exc:
            last[member.name] = repr(exc)
            return False
        text = info.decode() if isinstance(info, bytes) else str(info)
        fields = dict(line.split(":", 1) for line in text.split() if ":" in line)
        last[member.name] = text.replace("\r\n", " ")[:160]
        formed = (
            fields.get("cluster_state") == "ok"
            and fields.get("cluster_slots_assigned") == str(SLOTS)
            and fields.get("cluster_known_nodes") == str(len(self.members))
        )
        if not formed or member not in self._following:
            return formed
        # A replica counts once it has synced from its master (a failover test needs one
        # that can be promoted).
        with self.client(member, 1.0) as client:
            replication = client.info("replication")
        last[member.name] = f"master_link_status:{replication.get('master_link_status')}"
        return bool(replication.get("master_link_status") == "up")

    def declare_fresh(self) -> None:
        """Declare every master's current process fresh, each in its own shard's marker (see
        :meth:`~django_redlock.wire.scripts.Script.for_shard`): every shard votes at once.

        Raises:
            RuntimeError: a master refused (it restarted meanwhile, or is a replica now).
        """
        for master, (low, _) in zip(self.masters, self.ranges, strict=True):
            tag = slot_tag(low)
            script = DECLARE_FRESH.for_shard(tag)
            with self.client(master) as client:
                run_id = client.info("server")["run_id"]
                try:
                    client.eval(script.source, 1, f"{NODE_KEY}{{{tag}}}", run_id)
                except redis.ResponseError as exc:
                    raise RuntimeError(
                        f"{master.name}: could not declare it fresh: {exc}"
                    ) from None

    def node_id(self, member: LocalNode) -> str:
        """The member's cluster node id (``CLUSTER MYID``)."""
        with self.client(member) as client:
            reply = client.execute_command("CLUSTER", "MYID")
        return reply.decode() if isinstance(reply, bytes) else str(reply)

    def serving(self, slot: int) -> LocalNode:
        """The master that serves ``slot`` now, as the masters' own ``CLUSTER SHARDS`` say
        (following migrations, unlike :meth:`owner_of`)."""
        from django_redlock.wire.cluster import parse_shards

        with self.client(self.masters[0]) as client:
            slot_map = parse_shards(client.execute_command("CLUSTER", "SHARDS"), "127.0.0.1")
        endpoint = slot_map.master_of(slot)
        for master in self.masters:
            if endpoint == ("127.0.0.1", master.port):
                return master
        raise RuntimeError(f"no master of this cluster serves slot {slot}: {slot_map}")

    def begin_migration(self, slot: int, source: LocalNode, target: LocalNode) -> None:
        """Mark ``slot`` IMPORTING on ``target`` and MIGRATING on ``source`` (the first steps
        of resharding: the source answers ASK for the slot's keys it no longer has)."""
        source_id, target_id = self.node_id(source), self.node_id(target)
        with self.client(target) as client:
            client.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
        with self.client(source) as client:
            client.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)

    def move_keys(self, slot: int, source: LocalNode, target: LocalNode) -> int:
        """MIGRATE every key of ``slot`` from ``source`` to ``target`` (with their ttls);
        returns how many moved."""
        moved = 0
        with self.client(source) as client:
            while True:
                keys = client.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100)
                if not keys:
                    return moved
                client.execute_command(
                    "MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", *keys
                )
                moved += len(keys)

    def finish_migration(self, slot: int, target: LocalNode) -> None:
        """``CLUSTER SETSLOT <slot> NODE <target>`` on every master, the target first: the
        slot is the target's from now on (the others answer MOVED)."""
        target_id = self.node_id(target)
        for master in sorted(self.masters, key=lambda master: master is not target):
            with self.client(master) as client:
                client.execute_command("CLUSTER", "SETSLOT", slot, "NODE", target_id)

    def migrate(self, slot: int, target: LocalNode) -> None:
        """Move ``slot`` and its keys to master ``target``, as resharding does."""
        source = self.serving(slot)
        self.begin_migration(slot, source, target)
        self.move_keys(slot, source, target)
        self.finish_migration(slot, target)

    def owner_of(self, slot: int) -> LocalNode:
        """The master whose range holds ``slot`` as the fixture assigned it (not following
        later migrations: ask the cluster for that)."""
        for master, (low, high) in zip(self.masters, self.ranges, strict=True):
            if low <= slot <= high:
                return master
        raise ValueError(f"slot must be in 0..{SLOTS - 1}, not {slot!r}")

    def stop(self) -> None:
        """Stop every member, and remove the directory if this object made it."""
        for member in self.members:
            member.stop()
        if self._owns_directory:
            shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> LocalShardedNode:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<LocalShardedNode {len(self.masters)} shards {self.url}>"
