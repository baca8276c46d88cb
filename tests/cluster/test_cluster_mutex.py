"""A mutex on lock nodes that are Redis/Valkey Clusters (issue 42), sync transport: three
clusters of three shards as the three nodes, every lock's keys on its slot's owner, and a
slot moved under a held lease (MOVED, ASK) without a second holder."""

from __future__ import annotations

import threading
import time

import pytest

from django_redlock import LockContended, LockManager, LockNotAcquired
from django_redlock.localnodes import LocalNode
from django_redlock.localshards import LocalShardedNode
from django_redlock.wire.cluster import cluster_key, key_slot
from tests.cluster.conftest import (
    gone_everywhere,
    on_every_node,
    renewed_everywhere,
    renewed_on,
    subscribed,
)

PREFIX = "redlock:"


def _manager(nodes: list[LocalShardedNode]) -> LockManager:
    return LockManager([node.url for node in nodes], ttl=30.0, node_timeout=0.5)


def _lock_keys(node: LocalShardedNode) -> dict[str, list[bytes]]:
    """The keys on each master of ``node`` but the shards' own records."""
    found: dict[str, list[bytes]] = {}
    for master in node.masters:
        with node.client(master) as client:
            found[master.name] = sorted(
                key for key in client.keys("*") if b"django_redlock:node" not in key
            )
    return found


def test_hundreds_of_names_each_on_its_slots_owner(
    sharded3: list[LocalShardedNode], unique: str
) -> None:
    holder, other = _manager(sharded3), _manager(sharded3)
    names = [f"{unique}{index}" for index in range(300)]
    leases = [holder.acquire(name) for name in names]
    for name in names:  # each acquire returned at a quorum: the last node's may follow
        on_every_node(sharded3, cluster_key(PREFIX + name))
    try:
        expected: dict[str, set[bytes]] = {}
        for name in names:
            key = cluster_key(PREFIX + name)
            owner = sharded3[0].owner_of(key_slot(key))
            expected.setdefault(owner.name[-2:], set()).add(key.encode())
        shards_used = set()
        for node in sharded3:
            for master, keys in _lock_keys(node).items():
                mine = {key for key in keys if key.startswith(f"{{{PREFIX}{unique}".encode())}
                assert mine == expected.get(master[-2:], set()), master
                shards_used.add(master[-2:])
        assert len(expected) == 3  # the names spread over every shard
        for name in names[:20]:
            with pytest.raises(LockContended):
                other.acquire(name, blocking=False)
    finally:
        for lease in leases:
            lease.release()
    for name in names:
        gone_everywhere(sharded3, cluster_key(PREFIX + name))
    for node in sharded3:
        for keys in _lock_keys(node).values():
            assert not [
                key
                for key in keys
                if key.startswith(f"{{{PREFIX}{unique}".encode()) and b"\x00" not in key
            ]
    for name in names[:20]:  # free again, for anyone
        other.acquire(name, blocking=False).release()


def test_a_users_hash_tag_is_kept(sharded3: list[LocalShardedNode], unique: str) -> None:
    name = f"{{{unique}tenant}}:order"
    with _manager(sharded3).lock(name):
        on_every_node(sharded3, PREFIX + name)  # the key as written, in the user's slot


def test_extend_renews_on_every_cluster(sharded3: list[LocalShardedNode], unique: str) -> None:
    name = f"{unique}renewed"
    key = cluster_key(PREFIX + name)
    lease = _manager(sharded3).acquire(name)
    try:
        for node in sharded3:  # as if most of the lease had passed, on every node
            with node.client(node.owner_of(key_slot(key))) as client:
                assert client.pexpire(key, 10_000)  # as if a third of the lease had passed
        lease.extend()
        assert renewed_on(sharded3, key, 20_000) >= 2  # a quorum, at once
        renewed_everywhere(sharded3, key, 20_000)
    finally:
        lease.release()


def test_blocking_acquire_gets_the_lock_once_released(
    sharded3: list[LocalShardedNode], unique: str
) -> None:
    name = f"{unique}line"
    holder, waiter = _manager(sharded3), _manager(sharded3)
    lease = holder.acquire(name)
    released = threading.Event()
    got: list[bool] = []

    def wait() -> None:
        with waiter.lock(name, timeout=20.0):
            got.append(released.is_set())

    thread = threading.Thread(target=wait)
    thread.start()
    released.set()
    lease.release()
    thread.join(30.0)
    assert got == [True]  # taken, and only after the release


def _name_in(node: LocalShardedNode, shard: int, unique: str, avoid: int) -> tuple[str, int]:
    """A lock name whose slot shard ``shard`` serves, other than slot ``avoid``."""
    low, high = node.ranges[shard]
    for index in range(10_000):
        name = f"{unique}moving-{index}"
        slot = key_slot(cluster_key(PREFIX + name))
        if low <= slot <= high and slot != avoid:
            return name, slot
    raise AssertionError("no such name")


def test_moved_slot_under_a_held_lease(migrating3: list[LocalShardedNode], unique: str) -> None:
    """The lock's slot moves from shard 1 to shard 0 on every cluster (its keys with it)
    while the lease is held: nobody else takes it, and the holder renews and releases
    through MOVED, on the new owner."""
    nodes = migrating3
    name, slot = _name_in(nodes[0], 1, unique, avoid=nodes[0].ranges[1][0])
    key = cluster_key(PREFIX + name)
    holder, other = _manager(nodes), _manager(nodes)
    lease = holder.acquire(name)
    on_every_node(nodes, key)
    for node in nodes:
        node.migrate(slot, node.masters[0])
        assert node.serving(slot) is node.masters[0]
        with node.client(node.masters[0]) as client:
            assert client.exists(key) == 1
            client.pexpire(key, 2000)
    with pytest.raises(LockContended):
        other.acquire(name, blocking=False)
    lease.extend()
    assert renewed_on(nodes, key, 20_000) >= 2  # a quorum, where the key is now
    lease.extend()  # a node's MOVED that came after the quorum taught where the key is
    renewed_everywhere(nodes, key, 20_000)
    lease.release()
    gone_everywhere(nodes, key)
    other.acquire(name, blocking=False).release()


def _pttl_asking(node: LocalShardedNode, member: LocalNode, key: str) -> int:
    """``key``'s ms left on ``member``, read after ASKING (an importing slot's keys)."""
    with node.client(member) as client:
        client.execute_command("ASKING")
        return int(client.pttl(key))


def _renewed_asking(
    nodes: list[LocalShardedNode], shard: int, key: str, above_ms: int, timeout: float = 10.0
) -> None:
    """Wait until ``key`` has more than ``above_ms`` ms left on master ``shard`` of every
    cluster, read after ASKING: a renewal returns at a quorum, the last node's may follow."""
    deadline = time.monotonic() + timeout
    for node in nodes:
        while _pttl_asking(node, node.masters[shard], key) <= above_ms:
            assert time.monotonic() < deadline, f"{key!r} not renewed on {node}"
            time.sleep(0.01)


def test_ask_during_a_migration_under_a_held_lease(
    migrating3: list[LocalShardedNode], unique: str
) -> None:
    """The lock's slot migrates from shard 2 to shard 1 on every cluster while the lease is
    held. A renewal declares the lock key alone on a cluster node, so the server sends it
    where the key is: to the source while the key has not moved, then, once it has, after
    ASK to the importing shard; the holder renews through the migration. Nobody else takes
    the lock meanwhile (an acquire declares the keys it reads, which the migration splits:
    TRYAGAIN, a no vote), and once the slot is handed over the holder renews and releases on
    the new owner."""
    nodes = migrating3
    name, slot = _name_in(nodes[0], 2, unique, avoid=nodes[0].ranges[2][0])
    key = cluster_key(PREFIX + name)
    holder, other = _manager(nodes), _manager(nodes)
    lease = holder.acquire(name)
    on_every_node(nodes, key)
    for node in nodes:
        source, target = node.masters[2], node.masters[1]
        node.begin_migration(slot, source, target)
        with node.client(source) as client:
            client.pexpire(key, 10_000)  # as if a third of the lease had passed
    lease.extend()  # the slot migrating, the key still on the source
    assert renewed_on(nodes, key, 20_000) >= 2
    renewed_everywhere(nodes, key, 20_000)
    with pytest.raises(LockNotAcquired):
        other.acquire(name, blocking=False)
    for node in nodes:
        source, target = node.masters[2], node.masters[1]
        assert node.move_keys(slot, source, target) >= 1
        with node.client(target) as client:
            client.execute_command("ASKING")
            client.pexpire(key, 10_000)
    lease.extend()  # the key on the importing shard: the source answers ASK
    assert sum(_pttl_asking(node, node.masters[1], key) > 20_000 for node in nodes) >= 2
    _renewed_asking(nodes, 1, key, 20_000)
    with pytest.raises(LockNotAcquired):
        other.acquire(name, blocking=False)
    followed = holder.engine.connections.get().members
    for index, node in enumerate(nodes):
        assert (index, ("127.0.0.1", node.masters[1].port)) in followed  # the ASK
        node.finish_migration(slot, node.masters[1])
        with node.client(node.masters[1]) as client:
            client.pexpire(key, 2000)
    lease.extend()
    assert renewed_on(nodes, key, 20_000) >= 2  # a quorum, where the key is now
    lease.extend()  # a node's MOVED that came after the quorum taught where the key is
    renewed_everywhere(nodes, key, 20_000)
    lease.release()
    gone_everywhere(nodes, key)
    other.acquire(name, blocking=False).release()


# The poll fallback of these waiters is 30 s (retry_delay, ±50%): only a release heard on the
# cluster's pub/sub wakes them within the seconds the test allows (tests/core/test_waiting.py).
SLOW_POLL = 30.0
PROMPT = 5.0


def in_line(nodes: list[LocalShardedNode], name: str) -> int:
    """On how many nodes a waiter is in line for ``name``."""
    line = cluster_key(PREFIX + name + "\x00q")
    count = 0
    for node in nodes:
        with node.client(node.serving(key_slot(line))) as client:
            count += int(client.zcard(line) > 0)
    return count


def test_a_waiter_is_woken_by_the_release_not_by_its_poll(
    sharded3: list[LocalShardedNode], unique: str
) -> None:
    name = f"{unique}woken"
    holder = _manager(sharded3)
    waiter = LockManager([node.url for node in sharded3], ttl=30.0, retry_delay=SLOW_POLL)
    lease = holder.acquire(name)
    got = threading.Event()

    def wait() -> None:
        waiter.acquire(name, timeout=60.0).release()
        got.set()

    thread = threading.Thread(target=wait)
    thread.start()
    deadline = time.monotonic() + PROMPT
    while in_line(sharded3, name) < 3:
        assert time.monotonic() < deadline, "the waiter never queued"
        time.sleep(0.005)
    subscribed(sharded3, name)
    lease.release()
    assert got.wait(PROMPT), "the waiter slept through the release"
    thread.join(PROMPT)


def test_pairs_on_cluster_nodes_lend_no_courier(
    sharded3: list[LocalShardedNode], unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A release returns at its quorum, so the last cluster's shard connection often still
    owes the release's reply when the round ends: outside a resharding that reply is left to
    the next operation, as on a plain node, and no courier thread is started for it (one was,
    about every second pair at three nodes). Every lock is still released everywhere."""
    manager = _manager(sharded3)
    for index in range(20):  # every shard connection opened, every hello answered
        manager.acquire(f"{unique}-warm{index}").release()
    couriers: list[str] = []
    start = threading.Thread.start

    def counted(thread: threading.Thread) -> None:
        if thread.name == "django_redlock-courier":
            couriers.append(thread.name)
        start(thread)

    monkeypatch.setattr(threading.Thread, "start", counted)
    owed = 0
    connections = manager.engine.connections.get()
    names = [f"{unique}-{index}" for index in range(200)]
    for name in names:
        manager.acquire(name).release()
        owed += sum(len(conn.slots) for conn in connections.connections if conn is not None)
    assert couriers == []
    assert owed > 0  # the case this pins did arise: replies owed when a release returned
    manager.acquire(f"{unique}-last").release()  # reads what the last release left owed
    for name in names[-3:]:
        gone_everywhere(sharded3, cluster_key(PREFIX + name))
