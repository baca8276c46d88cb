"""A node's endpoint switched between plain and cluster mode while its clients run (issue 42):
plain or cluster is the server process's, learnt by every new connection, not the address's.

Each test takes and releases a lock on one mode, stops that server, starts the other mode on
the same port, and takes the lock again with the same manager: its keys must have the form
of the server now there, and a brand-new manager (as a process started after the switch
would be) must find the lock held. A one-shard cluster member owns every slot, so it would
take plain-form keys too: a manager that kept the mode it learnt first would hold a second
lock beside the new manager's (two holders of one name).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from django_redlock import LockContended, LockManager, LockNotAcquired
from django_redlock.aredlock import AsyncLockManager
from django_redlock.localnodes import LocalNode
from django_redlock.localshards import LocalShardedNode, free_port_pair
from django_redlock.wire import cluster_route
from django_redlock.wire.clients import client_for
from django_redlock.wire.cluster import SlotMap, cluster_key
from django_redlock.wire.cluster_route import NotCluster
from django_redlock.wire.nodes import parse_node
from django_redlock.wire.sync.connections import ConnectionSet

PREFIX = "redlock:"
NAME = "switched"
PLAIN_KEY = (PREFIX + NAME).encode()
CLUSTER_KEY = cluster_key(PREFIX + NAME).encode()


class Endpoint:
    """One TCP port whose server is plain or a one-shard cluster member, switched at will."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.port = free_port_pair()  # its cluster bus port free too
        self.plain: LocalNode | None = None
        self.cluster: LocalShardedNode | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start_plain(self) -> None:
        self.stop()
        self.plain = LocalNode(self.directory, name="plain", tcp=True)
        self.plain.port = self.port
        self.plain.start()

    def start_cluster(self) -> None:
        self.stop()
        self.cluster = LocalShardedNode(1, name="one")
        self.cluster.masters[0].port = self.port
        self.cluster.start()

    def keys(self) -> set[bytes]:
        """The lock's keys on the server now (its own records left out)."""
        member = self.plain if self.plain is not None else self.cluster.masters[0]  # type: ignore[union-attr]
        with client_for(parse_node(member.url), 5.0) as client:
            # A release leaves a mark beside the key (release.lua's gone mark): in the
            # same form, so the lock keys alone say which form was used.
            return {key for key in client.keys("*") if key in (PLAIN_KEY, CLUSTER_KEY)}

    def stop(self) -> None:
        for server in (self.plain, self.cluster):
            if server is not None:
                server.stop()
        self.plain = self.cluster = None


@pytest.fixture
def endpoint(tmp_path: Path) -> Iterator[Endpoint]:
    switched = Endpoint(tmp_path)
    try:
        yield switched
    finally:
        switched.stop()


# (first mode, second mode, the key the second mode's lock must have)
SWITCHES = [
    pytest.param("start_plain", "start_cluster", CLUSTER_KEY, id="plain-to-cluster"),
    pytest.param("start_cluster", "start_plain", PLAIN_KEY, id="cluster-to-plain"),
]


def _sync_manager(url: str) -> LockManager:
    return LockManager([url], ttl=30.0, node_timeout=0.5)


@pytest.mark.parametrize(("first", "second", "key"), SWITCHES)
def test_a_manager_follows_its_endpoint_into_the_other_mode(
    endpoint: Endpoint, first: str, second: str, key: bytes
) -> None:
    getattr(endpoint, first)()
    manager = _sync_manager(endpoint.url)
    manager.acquire(NAME).release()
    getattr(endpoint, second)()
    lease = manager.acquire(NAME)
    assert endpoint.keys() == {key}
    with pytest.raises(LockContended):
        _sync_manager(endpoint.url).acquire(NAME, blocking=False)
    lease.release()
    assert endpoint.keys() == set()
    _sync_manager(endpoint.url).acquire(NAME, blocking=False).release()


@pytest.mark.parametrize(("first", "second", "key"), SWITCHES)
def test_an_asyncio_manager_follows_its_endpoint_into_the_other_mode(
    endpoint: Endpoint, first: str, second: str, key: bytes
) -> None:
    async def main() -> None:
        await asyncio.to_thread(getattr(endpoint, first))
        manager = AsyncLockManager([endpoint.url], ttl=30.0, node_timeout=0.5)
        await (await manager.acquire(NAME)).release()
        await asyncio.to_thread(getattr(endpoint, second))
        lease = await manager.acquire(NAME)
        assert endpoint.keys() == {key}
        with pytest.raises(LockContended):
            await AsyncLockManager([endpoint.url], node_timeout=0.5).acquire(NAME, blocking=False)
        await lease.release()
        assert endpoint.keys() == set()
        fresh = AsyncLockManager([endpoint.url], node_timeout=0.5)
        await (await fresh.acquire(NAME, blocking=False)).release()

    asyncio.run(main())


def test_replica_acks_on_a_cluster_node_is_refused_by_name(
    sharded3: list[LocalShardedNode], unique: str
) -> None:
    """Every connection asks its server's mode, a node with REPLICA_ACKS too: on a cluster
    member the connection is refused with a reason that names the setting (before, the node
    was taken as plain, and the server refused its commands with MOVED or CROSSSLOT)."""
    url = f"{sharded3[0].url}?replica_acks=1"
    with pytest.raises(LockNotAcquired) as refused:
        LockManager([url], node_timeout=0.5).acquire(f"{unique}acked", blocking=False)
    assert "REPLICA_ACKS is not supported on cluster nodes" in repr(refused.value.node_errors)

    async def main() -> None:
        manager = AsyncLockManager([url], node_timeout=0.5)
        with pytest.raises(LockNotAcquired) as refused:
            await manager.acquire(f"{unique}async-acked", blocking=False)
        assert "REPLICA_ACKS is not supported on cluster nodes" in repr(refused.value.node_errors)

    asyncio.run(main())


def test_a_slot_map_read_from_a_plain_server_makes_the_node_plain(
    endpoint: Endpoint, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The other way to find a cluster switched off: the slot map read again after a shard's
    connection was lost (here at once: MAP_AFTER_FAILURE 0), from the node's own address,
    which answers as a plain server (NotCluster). The node is plain from then on, the round's
    command goes in plain form."""
    monkeypatch.setattr(cluster_route, "MAP_AFTER_FAILURE", 0.0)
    endpoint.start_cluster()
    manager = _sync_manager(endpoint.url)
    manager.acquire(NAME).release()
    endpoint.start_plain()
    unrouted: list[bool] = []
    unroute = ConnectionSet._unroute

    def spy(self: ConnectionSet, node: int, conn: object) -> None:
        unrouted.append(conn is None)
        unroute(self, node, conn)  # type: ignore[arg-type]

    monkeypatch.setattr(ConnectionSet, "_unroute", spy)
    lease = manager.acquire(NAME)
    assert unrouted == [True]  # by the map's read, not by a shard connection's question
    assert endpoint.keys() == {PLAIN_KEY}
    lease.release()
    route = cluster_route.ClusterRoute(parse_node(endpoint.url), SlotMap.of([]))
    with pytest.raises(NotCluster):
        route.read(5.0)
