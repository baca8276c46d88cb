"""Operators' views of lock nodes that are Redis/Valkey Clusters (issue 42): ``locks()`` (and
the admin page and ``redlock_status``, which list through it) walks every shard of every
cluster and merges each lock's keys across the nodes, in the names users gave."""

from __future__ import annotations

from django_redlock import LockManager
from django_redlock.core.listing import plain_key
from django_redlock.localshards import LocalShardedNode
from django_redlock.wire.cluster import cluster_key, key_slot
from tests.cluster.conftest import on_every_node

PREFIX = "redlock:"


def _manager(nodes: list[LocalShardedNode]) -> LockManager:
    return LockManager([node.url for node in nodes], ttl=30.0, node_timeout=0.5)


def test_plain_key_undoes_the_cluster_form() -> None:
    for key in ("redlock:job", "redlock:{t}a", "redlock:a}b", "redlock:s\x00s3", "redlock:r\x00r"):
        assert plain_key(cluster_key(key).encode(), PREFIX) == key.encode()
    assert plain_key(b"{other:job}", PREFIX) is None
    assert plain_key(b"other:{t}job", PREFIX) is None


def test_locks_lists_every_shard_of_every_cluster(
    sharded3: list[LocalShardedNode], unique: str
) -> None:
    manager = _manager(sharded3)
    names = [f"{unique}job{index:02}" for index in range(30)]
    held = [manager.acquire(name) for name in names]
    held.append(manager.acquire(f"{unique}{{tenant}}:order"))
    semaphore = manager.semaphore(f"{unique}sem", 3)
    held += [semaphore.acquire(blocking=False), semaphore.acquire(blocking=False)]
    held.append(manager.rwlock(f"{unique}rw").read(blocking=False))
    keys = [cluster_key(PREFIX + name) for name in names]
    assert len({sharded3[0].serving(key_slot(key)).name for key in keys}) == 3
    for key in [*keys, PREFIX + f"{unique}{{tenant}}:order"]:
        on_every_node(sharded3, key)
    on_every_node(sharded3, cluster_key(PREFIX + f"{unique}sem\x00s1"))
    on_every_node(sharded3, cluster_key(PREFIX + f"{unique}rw\x00r"))
    try:
        listing = manager.locks(unique)
        assert listing.unreachable == []
        assert listing.not_shown == 0
        labels = [lock.label for lock in listing.locks]
        assert labels == sorted(
            [
                *names,
                f"{unique}{{tenant}}:order",
                f"{unique}rw [read]",
                f"{unique}sem [semaphore slot 0]",
                f"{unique}sem [semaphore slot 1]",
            ],
            key=lambda label: label.replace(" [", "\x00"),
        )
        for lock in listing.locks:
            assert (lock.nodes, lock.total, lock.partial) == (3, 3, False)
            assert lock.ttl_max is not None
            assert 20 < lock.ttl_max <= 30
            assert lock.owner.get("thread") == "MainThread"
        capped = manager.locks(unique, limit=5)
        assert [lock.label for lock in capped.locks] == labels[:5]
        assert capped.not_shown == len(labels) - 5
        assert [lock.name for lock in manager.locks(f"{unique}job1").locks] == names[10:20]
    finally:
        for lease in held:
            lease.release()


def test_a_cluster_with_a_shard_down_is_unreachable_for_the_listing(
    unique: str,
) -> None:
    nodes = [LocalShardedNode(2, name=f"u{index}").start() for index in range(3)]
    try:
        manager = _manager(nodes)
        lease = manager.acquire(f"{unique}x")
        on_every_node(nodes, cluster_key(PREFIX + f"{unique}x"))
        nodes[0].masters[1].kill()
        listing = manager.locks(unique)
        assert listing.unreachable == [manager.addresses[0].label]
        assert [(lock.name, lock.nodes) for lock in listing.locks] == [(f"{unique}x", 2)]
        lease.release()
    finally:
        for node in nodes:
            node.stop()
