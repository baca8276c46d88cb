"""The asyncio manager on lock nodes that are Redis/Valkey Clusters (issue 42), and the first
contact of either manager with a cluster node: no command ever runs there in its plain form."""

from __future__ import annotations

import asyncio

import pytest

from django_redlock import LockContended, LockManager
from django_redlock.aredlock import AsyncLockManager
from django_redlock.localshards import LocalShardedNode
from django_redlock.wire.cluster import cluster_key, key_slot
from django_redlock.wire.scripts import NODE_KEY
from tests.cluster.conftest import (
    gone_everywhere,
    on_every_node,
    renewed_everywhere,
    renewed_on,
    subscribed,
)

PREFIX = "redlock:"


def _amanager(urls: list[str]) -> AsyncLockManager:
    # 2 s, not 0.5: nothing here is about timeouts, and CI runs two lanes of real servers on
    # two cores (the first test failed at a load of 8, on the code before issue 42's last
    # part as after it).
    return AsyncLockManager(urls, ttl=30.0, node_timeout=2.0)


def test_acquire_extend_release_and_contention(
    sharded3: list[LocalShardedNode], unique: str
) -> None:
    names = [f"{unique}{index}" for index in range(100)]
    sync = LockManager([node.url for node in sharded3], ttl=30.0, node_timeout=2.0)

    async def main() -> None:
        manager = _amanager([node.url for node in sharded3])
        leases = [await manager.acquire(name) for name in names]
        for name in names[:10]:
            with pytest.raises(LockContended):
                sync.acquire(name, blocking=False)
        for name in names:
            key = cluster_key(PREFIX + name)
            # Each acquire returned at a quorum: the last node's may follow.
            await asyncio.to_thread(on_every_node, sharded3, key)
            for node in sharded3:
                with node.client(node.owner_of(key_slot(key))) as client:
                    client.pexpire(key, 10_000)  # as if a third of the lease had passed
        for lease in leases:
            await lease.extend()
        key = cluster_key(PREFIX + names[0])
        assert renewed_on(sharded3, key, 20_000) >= 2
        await asyncio.to_thread(renewed_everywhere, sharded3, key, 20_000)
        for lease in leases:
            await lease.release()
        for name in names[:10]:
            sync.acquire(name, blocking=False).release()

    asyncio.run(main())


def test_blocking_acquire_gets_the_lock_once_released(
    sharded3: list[LocalShardedNode], unique: str
) -> None:
    name = f"{unique}line"

    async def main() -> None:
        holder = _amanager([node.url for node in sharded3])
        waiter = _amanager([node.url for node in sharded3])
        lease = await holder.acquire(name)
        released = asyncio.Event()

        async def wait() -> bool:
            async with waiter.lock(name, timeout=20.0):
                return released.is_set()

        task = asyncio.create_task(wait())
        await asyncio.sleep(0)
        released.set()
        await lease.release()
        assert await asyncio.wait_for(task, 30.0)  # taken, and only after the release

    asyncio.run(main())


def test_moved_slot_under_a_held_lease(migrating3: list[LocalShardedNode], unique: str) -> None:
    nodes = migrating3
    low, high = nodes[0].ranges[1]
    name = next(
        f"{unique}moving-{index}"
        for index in range(10_000)
        if low < key_slot(cluster_key(f"{PREFIX}{unique}moving-{index}")) <= high
    )
    key = cluster_key(PREFIX + name)
    slot = key_slot(key)

    async def main() -> None:
        holder = _amanager([node.url for node in nodes])
        other = _amanager([node.url for node in nodes])
        lease = await holder.acquire(name)
        # From a thread: the last node's request goes out on this loop meanwhile.
        await asyncio.to_thread(on_every_node, nodes, key)
        for node in nodes:
            node.migrate(slot, node.masters[0])
            with node.client(node.masters[0]) as client:
                client.pexpire(key, 2000)
        with pytest.raises(LockContended):
            await other.acquire(name, blocking=False)
        await lease.extend()
        assert renewed_on(nodes, key, 20_000) >= 2  # a quorum, where the key is now
        await lease.extend()  # a MOVED after the quorum taught where the key is
        await asyncio.to_thread(renewed_everywhere, nodes, key, 20_000)
        await lease.release()
        await asyncio.to_thread(gone_everywhere, nodes, key)
        await (await other.acquire(name, blocking=False)).release()

    asyncio.run(main())


def _plain_form_would_run(node: LocalShardedNode, unique: str) -> str:
    """A name whose plain key lives on the member that also serves the plain restart marker's
    slot: a plain-form acquire sent there would run (and take the plain key)."""
    seed = node.owner_of(key_slot(NODE_KEY))
    for index in range(10_000):
        name = f"{unique}first-{index}"
        if node.owner_of(key_slot(PREFIX + name)) is seed:
            return name
    raise AssertionError("no such name")


@pytest.mark.parametrize("kind", ["sync", "asyncio"])
def test_the_first_contact_never_runs_a_plain_command(
    migrating3: list[LocalShardedNode], unique: str, kind: str
) -> None:
    """Brand-new clusters (never reached by this process), each listed by the URL of the
    member that serves the plain marker's slot, and a name whose plain key that member
    serves too: the very first acquire still takes only the cluster form of the key."""
    nodes = migrating3
    name = _plain_form_would_run(nodes[0], unique)
    urls = [node.owner_of(key_slot(NODE_KEY)).url for node in nodes]
    key = cluster_key(PREFIX + name)
    if kind == "sync":
        LockManager(urls, ttl=30.0, node_timeout=2.0).acquire(name)
        on_every_node(nodes, key)  # the last node's request is delivered by the courier
    else:

        async def main() -> None:
            # The loop ends with this coroutine: the last node's request, if still held
            # until that node answered whether it is a cluster, may never go (a quorum
            # has the lease), as a request held behind any unanswered hello at a loop's end.
            await _amanager(urls).acquire(name)

        asyncio.run(main())
    holding = 0
    for node in nodes:
        with node.client(node.owner_of(key_slot(NODE_KEY))) as client:
            assert client.exists(PREFIX + name) == 0  # the plain form, never taken
            assert client.exists(NODE_KEY) == 0  # nor the plain marker written
        with node.client(node.owner_of(key_slot(key))) as client:
            holding += client.exists(key)
    assert holding >= 2


def test_a_waiter_is_woken_by_the_release_not_by_its_poll(
    sharded3: list[LocalShardedNode], unique: str
) -> None:
    """As the sync test: the waiter's poll is 30 s (±50%), only a release heard on the cluster's
    pub/sub wakes it within the 5 s allowed."""
    name = f"{unique}woken"
    line = cluster_key(PREFIX + name + "\x00q")

    def queued() -> int:
        count = 0
        for node in sharded3:
            with node.client(node.serving(key_slot(line))) as client:
                count += int(client.zcard(line) > 0)
        return count

    async def main() -> None:
        holder = _amanager([node.url for node in sharded3])
        waiter = AsyncLockManager([node.url for node in sharded3], ttl=30.0, retry_delay=30.0)
        lease = await holder.acquire(name)

        async def wait() -> None:
            await (await waiter.acquire(name, timeout=60.0)).release()

        task = asyncio.create_task(wait())
        # Looked at from a thread: the waiter's task runs on this loop meanwhile.
        await asyncio.to_thread(subscribed, sharded3, name)
        assert queued() == 3, "the waiter is not in line"
        await lease.release()
        await asyncio.wait_for(task, 5.0)  # else it slept through the release

    asyncio.run(main())
