"""Restarts and first use on nodes started the way an operator starts them.

No fixture prepares these nodes: they are plain ``valkey-server``/``redis-server`` processes
with the persistence options given (``LocalCluster(fresh=False)``), and nothing is declared
fresh unless the test is about declaring. A small ``max_ttl`` (the quarantine) keeps the waits
short. The suite runs on the bundled Valkey and again on Redis 7.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest

from django_redlock import AsyncLockManager, LockContended, LockManager, LockNotAcquired
from django_redlock.localnodes import DURABLE_ARGS, LocalCluster, LocalNode
from tests.helpers import lock_token, node_client, votes_recorded

pytestmark = pytest.mark.slow

DURABLE = DURABLE_ARGS
SNAPSHOTS = ("--appendonly", "no")  # SAVE writes n<i>.rdb, loaded again on restart
NODE_TIMEOUT = 0.5  # generous: a node that just started compiles the scripts first


def manager_for(cluster: LocalCluster, max_ttl: float, ttl: float | None = None) -> LockManager:
    return LockManager(
        cluster.urls,
        ttl=ttl or max_ttl,
        max_ttl=max_ttl,
        node_timeout=NODE_TIMEOUT,
        retry_delay=0.05,
    )


def wait_until_up(node: LocalNode, seconds: int) -> None:
    """Until the server says it has been up ``seconds`` (its own INFO uptime)."""
    with node_client(node) as client:
        while int(client.info("server")["uptime_in_seconds"]) < seconds:
            time.sleep(0.1)


def quarantined_nodes(error: LockNotAcquired) -> list[str]:
    return [node for node, text in error.node_errors.items() if "QUARANTINED" in text]


@pytest.fixture
def durable3() -> Iterator[LocalCluster]:
    with LocalCluster(3, extra_args=DURABLE, fresh=False) as cluster:
        yield cluster


@pytest.fixture
def snapshots5() -> Iterator[LocalCluster]:
    with LocalCluster(5, extra_args=SNAPSHOTS, fresh=False) as cluster:
        yield cluster


def test_a_node_up_longer_than_max_ttl_votes_at_once():
    with LocalCluster(3, fresh=False) as cluster:
        for node in cluster:
            wait_until_up(node, 3)  # up > max_ttl + the one second INFO may round up
        manager = manager_for(cluster, max_ttl=1.0)
        manager.acquire("first-use", blocking=False).release()


def test_a_brand_new_durable_node_votes_at_once(durable3):
    manager = manager_for(durable3, max_ttl=60.0, ttl=5.0)
    manager.acquire("first-use", blocking=False).release()


def test_a_durable_node_restarted_from_its_aof_keeps_the_lock_and_votes(durable3):
    holder = manager_for(durable3, max_ttl=30.0, ttl=20.0)
    lease = holder.acquire("orders:1", blocking=False)
    lease.extend()  # every node answers it (an acquire returns at a quorum)
    with node_client(durable3[0]) as client:
        deadline = time.monotonic() + 5
        while not client.exists("redlock:orders:1"):
            assert time.monotonic() < deadline
            time.sleep(0.01)
    durable3[0].restart()  # SIGKILL; the AOF (fsync always) has the lock
    with node_client(durable3[0]) as client:
        assert lock_token(client, "redlock:orders:1") == lease.token.encode()
    rival = manager_for(durable3, max_ttl=30.0, ttl=20.0)
    with pytest.raises(LockContended) as info:
        rival.acquire("orders:1", blocking=False)
    assert not quarantined_nodes(info.value)
    lease.release()
    # The restarted node votes at once: with node 1 paused, a quorum needs it.
    durable3[1].pause()
    try:
        rival.acquire("orders:2", blocking=False).release()
    finally:
        durable3[1].resume()


def test_a_node_restarted_empty_waits_out_the_quarantine():
    # Three plain nodes (no persistence) that an operator declared fresh on day one.
    with LocalCluster(3, fresh=False) as cluster:
        holder = manager_for(cluster, max_ttl=2.0)
        done = holder.declare_fresh()
        assert [item.declared for item in done] == [True, True, True]
        lease = holder.acquire("orders:2", blocking=False)
        cluster[1].restart()  # forgot the lock
        cluster[2].pause()
        rival = manager_for(cluster, max_ttl=2.0)
        refusals: list[str] = []
        try:
            while lease.validity > 0.05:
                with pytest.raises(LockNotAcquired) as info:
                    rival.acquire("orders:2", blocking=False)
                assert info.value.votes == 0  # node 0: held; node 1: quarantined
                # (Node 1's answer is not waited for once node 2, paused, owes many replies.)
                refusals.extend(
                    text for node, text in info.value.node_errors.items() if node == rival.nodes[1]
                )
                time.sleep(0.05)
        finally:
            cluster[2].resume()
        text = refusals[0]
        assert "up 0 s, not proven durable (appendonly no): votes again in" in text
        # Once every lease it may have granted ran out, it votes again by itself.
        deadline = time.monotonic() + 10
        while True:
            try:
                rival.acquire("orders:2", blocking=False).release()
                break
            except LockNotAcquired:
                assert time.monotonic() < deadline, "the restarted node never voted again"
                time.sleep(0.1)


def test_a_snapshot_taken_after_a_declaration_does_not_let_a_restart_vote(snapshots5):
    """The Redis distlock page's scenario: A, B, C hold the lock; C restarts having lost it
    (from an RDB snapshot older than the lock); another client gets C, D, E."""
    nodes = snapshots5
    holder = manager_for(nodes, max_ttl=30.0, ttl=20.0)
    holder.declare_fresh()
    with node_client(nodes[2]) as client:
        client.save()  # the snapshot has the declaration, not the lock to come
    nodes[3].pause()
    nodes[4].pause()
    try:
        lease = holder.acquire("seat:9", blocking=False)  # on A, B, C only
    finally:
        nodes[3].resume()
        nodes[4].resume()
    holder.close()
    with node_client(nodes[3]) as client:  # the acquire queued while D was paused is over
        client.delete("redlock:seat:9")
    with node_client(nodes[4]) as client:
        client.delete("redlock:seat:9")
    nodes[2].restart()  # C comes back from the snapshot
    with node_client(nodes[2]) as client:
        assert client.exists("redlock:seat:9") == 0  # it forgot the lock
    rival = manager_for(nodes, max_ttl=30.0, ttl=20.0)
    with pytest.raises(LockNotAcquired) as info:
        rival.acquire("seat:9", blocking=False)
    assert info.value.votes <= 2  # D and E; C refuses
    assert quarantined_nodes(info.value) == [rival.nodes[2]]
    assert lease.validity > 0


def test_a_client_with_a_shorter_max_ttl_does_not_shorten_the_quarantine(snapshots5):
    nodes = snapshots5
    long_lease = manager_for(nodes, max_ttl=8.0)
    long_lease.declare_fresh()
    nodes[3].pause()
    nodes[4].pause()
    try:
        lease = long_lease.acquire("report", blocking=False)  # on A, B, C, for 8 s
    finally:
        nodes[3].resume()
        nodes[4].resume()
    for index in (3, 4):
        with node_client(nodes[index]) as client:
            client.delete("redlock:report")
    nodes[2].restart()  # C forgot the lock, and the 8 s quarantine it was told of
    # A client started after the crash, whose own leases are short.
    short = manager_for(nodes, max_ttl=1.0)
    tries = 0
    while lease.validity > 0.1:
        with pytest.raises(LockNotAcquired):
            short.acquire("report", blocking=False)
        tries += 1
        time.sleep(0.1)
    assert tries > 20  # it kept trying well past its own 1 s quarantine


def info_calls(cluster: LocalCluster) -> int:
    total = 0
    for node in cluster:
        with node_client(node) as client:
            total += int(client.info("commandstats").get("cmdstat_info", {}).get("calls", 0))
    return total


def test_the_acquire_hot_path_asks_no_info_sync_and_asyncio(cluster3):
    """Each connection names its server process once; after that the acquire script compares
    one string instead of calling INFO (scripts/acquire.lua)."""
    sync = LockManager(cluster3.urls)
    sync.acquire("warm").release()
    votes_recorded(sync)  # its thread's INFO calls, once per node, fall before the count
    for node in cluster3:
        with node_client(node) as client:
            client.config_resetstat()
    for index in range(20):
        sync.acquire(f"hot:{index}", blocking=False).release()
    assert info_calls(cluster3) == 0

    async def main() -> int:
        manager = AsyncLockManager(cluster3.urls)
        await (await manager.acquire("warm")).release()
        votes_recorded(manager)
        for node in cluster3:
            with node_client(node) as client:
                client.config_resetstat()
        for index in range(20):
            await (await manager.acquire(f"ahot:{index}", blocking=False)).release()
        return info_calls(cluster3)

    assert asyncio.run(main()) == 0


def test_a_durable_node_restarted_votes_on_the_first_asyncio_try(durable3):
    async def main() -> None:
        manager = AsyncLockManager(durable3.urls, ttl=5.0, max_ttl=60.0, node_timeout=0.5)
        await (await manager.acquire("first", blocking=False)).release()
        durable3[0].restart()
        await asyncio.sleep(0.05)  # the loop hears that the old connection closed
        durable3[1].pause()
        try:  # only node 0 (just restarted) and node 2 can make the quorum
            await (await manager.acquire("second", blocking=False)).release()
        finally:
            durable3[1].resume()

    asyncio.run(main())
