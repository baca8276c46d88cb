"""A shard of a cluster node fails over during a held lease (issue 42): its master is killed,
its replica promoted (CLUSTER FAILOVER TAKEOVER). The promoted replica may lack the lease's key
(replication is asynchronous; the test deletes it there to be sure), so it is quarantined like
a restart, by its shard's own marker: nobody else takes the lock within the lease's validity,
the other shards of that cluster keep voting, and the shard votes again by itself once the
quarantine has passed."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest

from django_redlock import (
    Lease,
    LockContended,
    LockManager,
    LockNotAcquired,
    QuorumUnreachable,
)
from django_redlock.aredlock import AsyncLockManager
from django_redlock.core.health import status
from django_redlock.localshards import LocalShardedNode
from django_redlock.wire.cluster import cluster_key, key_slot
from tests.cluster.conftest import on_every_node

PREFIX = "redlock:"
# The quarantine is the longest lease a client may take (max_ttl): short here, so that the
# shard votes again within the test's patience; the lease is that long.
MAX_TTL = 6.0


@pytest.fixture
def failing() -> Iterator[list[LocalShardedNode]]:
    """Three lock nodes of three shards: the first with a replica per shard."""
    nodes: list[LocalShardedNode] = []
    try:
        nodes.append(LocalShardedNode(3, replicas=1, name="fa").start())
        for index in (1, 2):
            nodes.append(LocalShardedNode(3, name=f"fb{index}").start())
        yield nodes
    finally:
        for node in nodes:
            node.stop()


def _manager(urls: list[str]) -> LockManager:
    return LockManager(urls, ttl=MAX_TTL, max_ttl=MAX_TTL, node_timeout=0.5)


def _name_on(node: LocalShardedNode, shard: int, prefix: str) -> str:
    for index in range(10_000):
        name = f"{prefix}{index}"
        if node.owner_of(key_slot(cluster_key(PREFIX + name))) is node.masters[shard]:
            return name
    raise AssertionError("no such name")


def _promoted(node: LocalShardedNode, shard: int, timeout: float = 30.0) -> None:
    """Kill shard ``shard``'s master and promote its replica (TAKEOVER: no vote of the other
    masters needed), then wait until every live member names the replica master of the
    shard's slots."""
    master, replica = node.masters[shard], node.replicas[shard]
    master.kill()
    with node.client(replica) as client:
        client.execute_command("CLUSTER", "FAILOVER", "TAKEOVER")
    slot = node.ranges[shard][0]
    deadline = time.monotonic() + timeout
    for member in node.members:
        if member is master:
            continue
        while True:
            with node.client(member) as client:
                owners = {
                    int(entry[0]) <= slot <= int(entry[1]) and int(entry[2][1]) == replica.port
                    for entry in client.execute_command("CLUSTER", "SLOTS")
                    if int(entry[0]) <= slot <= int(entry[1])
                }
            if owners == {True}:
                break
            assert time.monotonic() < deadline, f"{member.name} never saw the promotion"
            time.sleep(0.02)


def _refusal(manager: LockManager, name: str, lease: Lease, timeout: float = 10.0) -> str:
    """The refusal of a try of ``name`` once the node no longer answers "connection
    refused" (the dead master's address, until the client reads the map again); ``lease``
    is renewed meanwhile."""
    deadline = time.monotonic() + timeout
    while True:
        with pytest.raises(QuorumUnreachable) as refused:
            manager.acquire(name, blocking=False)
        text = str(refused.value)
        if "connection refused" not in text:
            return text
        assert time.monotonic() < deadline, text
        lease.extend()
        time.sleep(0.1)


def test_a_shard_failover_during_a_held_lease(failing: list[LocalShardedNode]) -> None:
    """The holder renews its lease throughout (on the other clusters: a quorum), so it is
    valid at every check below."""
    nodes = failing
    first = nodes[0]
    urls = [node.url for node in nodes]
    name = _name_on(first, 1, "held-")
    # Another lock of the failed-over shard: the holder's renewals re-create its key there.
    same_shard = _name_on(first, 1, "same-")
    other_shard = _name_on(first, 2, "other-")
    key = cluster_key(PREFIX + name)
    holder, rival = _manager(urls), _manager(urls)
    alone = _manager([first.url])  # the first cluster's own vote, alone
    alone.acquire(other_shard).release()
    rival.acquire(other_shard).release()  # every manager knows every node is a cluster
    lease = holder.acquire(name)
    on_every_node(nodes, key)
    _promoted(first, 1)
    replica = first.replicas[1]
    with first.client(replica) as client:
        client.delete(key)  # as if the write had not reached it before its master died
    lease.extend()
    with pytest.raises((LockContended, LockNotAcquired)):
        rival.acquire(name, blocking=False)
    # The promoted shard refuses by its own rule (once the client learnt of the promotion:
    # the dead master's refused connection has the map read again); the other shards of
    # its cluster vote.
    assert "quarantin" in _refusal(alone, same_shard, lease).lower()
    alone.acquire(other_shard, blocking=False).release()
    report = status(alone, timeout=1.0, record=False)
    shards = report.nodes[0].shards
    assert [shard.vote for shard in shards] == ["votes", "quarantined", "votes"]
    assert shards[1].master == f"127.0.0.1:{replica.port}"
    assert shards[1].promoted
    # By itself, once the quarantine (MAX_TTL) has passed since the promotion: a poll with
    # a deadline, as the server's clock decides. The rival never gets the lock meanwhile.
    deadline = time.monotonic() + 60.0
    while True:
        lease.extend()
        with pytest.raises((LockContended, LockNotAcquired)):
            rival.acquire(name, blocking=False)
        try:
            alone.acquire(same_shard, blocking=False).release()
            break
        except QuorumUnreachable as exc:
            refusal = str(exc)
        assert "quarantin" in refusal.lower(), refusal
        assert time.monotonic() < deadline, "the promoted shard never voted again"
        time.sleep(0.1)
    assert not lease.lost
    lease.release()
    rival.acquire(name, blocking=False).release()


def test_the_asyncio_manager_finds_the_promoted_master(
    failing: list[LocalShardedNode],
) -> None:
    """The asyncio transport learns of a promotion as the sync one does: its broken shard
    connection has the map read again (in a thread; here from another member, as the dead
    master is the one the node's URL names), and the promoted shard's refusal is its
    quarantine, not a refused connection; the cluster's other shards grant."""
    first = failing[0]
    name = _name_on(first, 0, "async-held-")
    other_shard = _name_on(first, 1, "async-other-")

    async def main() -> None:
        alone = AsyncLockManager([first.url], ttl=MAX_TTL, max_ttl=MAX_TTL, node_timeout=0.5)
        await (await alone.acquire(name)).release()  # classified, every shard voted
        await asyncio.to_thread(_promoted, first, 0)
        # The first tries meet the dead master's address (the one the URL names: the map is
        # then read from another member); then the promoted one answers, quarantined.
        deadline = time.monotonic() + 10.0
        while True:
            with pytest.raises(QuorumUnreachable) as refused:
                await alone.acquire(name, blocking=False)
            text = str(refused.value)
            if "quarantin" in text.lower():
                break
            assert time.monotonic() < deadline, text
            await asyncio.sleep(0.1)
        await (await alone.acquire(other_shard, blocking=False)).release()

    asyncio.run(main())
