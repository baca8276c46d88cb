"""Every lease kind on lock nodes that are Redis/Valkey Clusters (issue 42): semaphores,
read-write locks, multi-locks (one hash tag; names across slots refused before anything is
sent), adopt, and a waiter's line and wake-up; each lock's keys on its slot's owner, in every
cluster. Three clusters of three shards as the three nodes."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from django_redlock import (
    LockContended,
    LockLost,
    LockManager,
    LockNotAcquired,
    QuorumUnreachable,
)
from django_redlock.aredlock import AsyncLockManager
from django_redlock.localshards import LocalShardedNode
from django_redlock.wire.cluster import cluster_key, hash_tag, key_slot
from tests.cluster.conftest import gone_everywhere, on_every_node

PREFIX = "redlock:"
# The poll fallback of the waiters below: only a release heard on the cluster's pub/sub wakes
# them within the seconds the tests allow.
SLOW_POLL = 30.0
PROMPT = 5.0


def _manager(nodes: list[LocalShardedNode], retry_delay: float = 0.2) -> LockManager:
    return LockManager(
        [node.url for node in nodes], ttl=30.0, node_timeout=0.5, retry_delay=retry_delay
    )


def _keys_of(node: LocalShardedNode, tag: str) -> dict[str, set[bytes]]:
    """The keys of hash tag ``tag`` on each master of ``node``, by the master's name."""
    found: dict[str, set[bytes]] = {}
    for master in node.masters:
        with node.client(master) as client:
            keys = set(client.scan_iter(match=f"*{{{tag}}}*".replace("[", "\\["), count=1000))
            found[master.name] = {key for key in keys if hash_tag(key) == tag.encode()}
    return found


def _all_on_owner(nodes: list[LocalShardedNode], tag: str) -> set[bytes]:
    """Check that every key of hash tag ``tag`` is on the master serving the tag's slot, in
    every cluster, and return the keys of the first cluster."""
    slot = key_slot("{" + tag + "}")
    first: set[bytes] | None = None
    for node in nodes:
        owner = node.serving(slot).name
        for master, keys in _keys_of(node, tag).items():
            if master != owner:
                assert not keys, f"keys of slot {slot} on {master}, not its owner {owner}"
            elif first is None:
                first = keys
    return first or set()


def test_semaphores_keep_their_limit_and_their_keys_on_one_shard(
    sharded3: list[LocalShardedNode], unique: str
) -> None:
    holder, other = _manager(sharded3), _manager(sharded3)
    names = [f"{unique}sem{index}" for index in range(30)]
    held = []
    for name in names:
        semaphore = holder.semaphore(name, 2)
        held += [semaphore.acquire(blocking=False), semaphore.acquire(blocking=False)]
        with pytest.raises(LockContended):
            other.semaphore(name, 2).acquire(blocking=False)
    assert {lease.slot for lease in held} == {0, 1}
    slots = {key_slot(cluster_key(PREFIX + name)) for name in names}
    shards = {sharded3[0].serving(slot).name for slot in slots}
    assert len(shards) == 3  # the semaphores spread over every shard
    for name in names:
        slot_key = cluster_key(PREFIX + name + "\x00s1")
        on_every_node(sharded3, slot_key)
        keys = _all_on_owner(sharded3, PREFIX + name)
        assert {slot_key.encode(), cluster_key(PREFIX + name + "\x00s0").encode()} <= keys
    for lease in held:
        lease.release()
    for name in names:
        gone_everywhere(sharded3, cluster_key(PREFIX + name + "\x00s1"))
        other.semaphore(name, 2).acquire(blocking=False).release()


def test_read_write_lock(sharded3: list[LocalShardedNode], unique: str) -> None:
    name = f"{unique}rw"
    first, second = _manager(sharded3), _manager(sharded3)
    readers = [first.rwlock(name).read(blocking=False), second.rwlock(name).read(blocking=False)]
    with pytest.raises(LockContended):
        second.rwlock(name).write(blocking=False)
    on_every_node(sharded3, cluster_key(PREFIX + name + "\x00r"))
    assert cluster_key(PREFIX + name + "\x00r").encode() in _all_on_owner(sharded3, PREFIX + name)
    for lease in readers:
        lease.extend()
        lease.release()
    writer = first.rwlock(name).write(blocking=False)
    with pytest.raises(LockContended):
        second.rwlock(name).read(blocking=False)
    with pytest.raises(LockContended):
        second.acquire(name, blocking=False)  # the writer is the lock of the same name
    writer.extend()
    writer.release()
    gone_everywhere(sharded3, cluster_key(PREFIX + name))
    second.rwlock(name).read(blocking=False).release()


def _woken_within(
    nodes: list[LocalShardedNode], channel_prefix: str, take: object, release: object
) -> None:
    """Start ``take`` (a blocking acquire that releases what it got) in a thread, wait until
    it listens on every cluster for ``channel_prefix``'s wake-ups, call ``release``, and check
    that the waiter got it within :data:`PROMPT` (its poll is :data:`SLOW_POLL`)."""
    got = threading.Event()

    def wait() -> None:
        take()  # type: ignore[operator]
        got.set()

    thread = threading.Thread(target=wait)
    thread.start()
    pattern = cluster_key(channel_prefix).replace("[", "\\[") + "*"
    deadline = time.monotonic() + PROMPT
    for node in nodes:
        while True:
            with node.client(node.masters[0]) as client:
                if client.pubsub_channels(pattern):
                    break
            assert time.monotonic() < deadline, f"nobody listens on {pattern!r} on {node}"
            time.sleep(0.005)
    release()  # type: ignore[operator]
    assert got.wait(PROMPT), "the waiter slept through the release"
    thread.join(PROMPT)


def test_a_semaphore_waiter_is_woken_by_the_release(
    sharded3: list[LocalShardedNode], unique: str
) -> None:
    name = f"{unique}sem-line"
    holder = _manager(sharded3)
    waiter = _manager(sharded3, retry_delay=SLOW_POLL)
    lease = holder.semaphore(name, 1).acquire(blocking=False)
    _woken_within(
        sharded3,
        PREFIX + name + "\x00s\x00w",
        lambda: waiter.semaphore(name, 1).acquire(timeout=60.0).release(),
        lease.release,
    )


def test_a_writer_waits_in_line_for_the_reader(
    sharded3: list[LocalShardedNode], unique: str
) -> None:
    name = f"{unique}rw-line"
    holder = _manager(sharded3)
    waiter = _manager(sharded3, retry_delay=SLOW_POLL)
    lease = holder.rwlock(name).read(blocking=False)
    _woken_within(
        sharded3,
        PREFIX + name + "\x00w",
        lambda: waiter.rwlock(name).write(timeout=60.0).release(),
        lease.release,
    )


def test_lock_many_in_one_slot_is_all_or_none(
    sharded3: list[LocalShardedNode], unique: str
) -> None:
    tag = f"{unique}order"
    names = [f"{{{tag}}}:{part}" for part in ("items", "invoice", "stock")]
    holder, other = _manager(sharded3), _manager(sharded3)
    single = other.acquire(names[1])
    with pytest.raises(LockContended):
        holder.lock_many(names, blocking=False)
    for node in sharded3:
        with node.client(node.serving(key_slot(tag))) as client:
            assert not client.exists(PREFIX + names[0], PREFIX + names[2])
    single.release()
    lease = holder.lock_many(names, blocking=False)
    for name in names:
        on_every_node(sharded3, PREFIX + name)
        with pytest.raises(LockContended):
            other.acquire(name, blocking=False)
    lease.extend()
    lease.release()
    for name in names:
        gone_everywhere(sharded3, PREFIX + name)
        other.acquire(name, blocking=False).release()


def test_lock_many_across_slots_is_refused_before_anything_is_sent(
    sharded3: list[LocalShardedNode], unique: str
) -> None:
    names = [f"{unique}a", f"{unique}b", f"{unique}c", f"{unique}d"]
    slots = sorted({key_slot(cluster_key(PREFIX + name)) for name in names})
    assert len(slots) > 1
    manager = _manager(sharded3)
    manager.acquire(f"{unique}first").release()  # the nodes are known clusters by now
    with pytest.raises(ValueError, match="hash tag") as refused:
        manager.lock_many(names, timeout=5.0)
    for slot in slots:
        assert f"slot {slot}" in str(refused.value)

    async def main() -> None:
        amanager = AsyncLockManager([node.url for node in sharded3], ttl=30.0)
        await (await amanager.acquire(f"{unique}first")).release()
        with pytest.raises(ValueError, match="hash tag"):
            await amanager.lock_many(names, blocking=False)

    asyncio.run(main())
    for node in sharded3:
        for master in node.masters:
            with node.client(master) as client:
                assert not list(client.scan_iter(match=f"*{unique}[abcd]*"))


def test_adopt_moves_the_lease_to_the_adopter(
    sharded3: list[LocalShardedNode], unique: str
) -> None:
    name = f"{unique}adopted"
    giver, taker, other = _manager(sharded3), _manager(sharded3), _manager(sharded3)
    handle = giver.acquire(name).handle()
    adopted = taker.adopt(handle)
    with pytest.raises(LockLost):
        other.adopt(handle)  # the handle's token is refused from then on
    with pytest.raises(LockContended):
        other.acquire(name, blocking=False)
    adopted.extend()
    adopted.release()
    gone_everywhere(sharded3, cluster_key(PREFIX + name))
    other.acquire(name, blocking=False).release()


def test_every_kind_with_the_asyncio_manager(sharded3: list[LocalShardedNode], unique: str) -> None:
    sync = _manager(sharded3)
    tag = f"{unique}async"

    async def main() -> None:
        manager = AsyncLockManager([node.url for node in sharded3], ttl=30.0, node_timeout=0.5)
        slot = await manager.semaphore(f"{unique}asem", 1).acquire(blocking=False)
        with pytest.raises(LockContended):
            sync.semaphore(f"{unique}asem", 1).acquire(blocking=False)
        reader = await manager.rwlock(f"{unique}arw").read(blocking=False)
        with pytest.raises(LockContended):
            sync.rwlock(f"{unique}arw").write(blocking=False)
        many = await manager.lock_many([f"{{{tag}}}1", f"{{{tag}}}2"], blocking=False)
        with pytest.raises(LockContended):
            sync.acquire(f"{{{tag}}}2", blocking=False)
        for lease in (slot, reader, many):
            await lease.extend()
            await lease.release()

    asyncio.run(main())
    sync.semaphore(f"{unique}asem", 1).acquire(blocking=False).release()
    sync.rwlock(f"{unique}arw").write(blocking=False).release()
    sync.lock_many([f"{{{tag}}}1", f"{{{tag}}}2"], blocking=False).release()


def test_no_write_beside_readers_while_their_slot_migrates(
    migrating3: list[LocalShardedNode], unique: str
) -> None:
    """A reader holds the read-write lock; its slot starts migrating on every cluster, the
    keys not moved yet. The lock key is absent on the source, which answers ASK for a command
    that declares it alone; on the importing shard, which lacks the readers, the acquire
    script would start and stop at its first key that is not there (an error after what it
    wrote so far). The acquire declares the keys it reads too on a cluster node: the server
    refuses it before it runs (TRYAGAIN), a no vote, and nobody takes the lock beside the
    reader."""
    nodes = migrating3
    name = f"{unique}split"
    key = cluster_key(PREFIX + name)
    slot = key_slot(key)
    reader, other = _manager(nodes), _manager(nodes)
    lease = reader.rwlock(name).read(blocking=False)
    on_every_node(nodes, cluster_key(PREFIX + name + "\x00r"))
    for node in nodes:
        source = node.serving(slot)
        target = next(master for master in node.masters if master is not source)
        node.begin_migration(slot, source, target)
    with pytest.raises((LockContended, LockNotAcquired), match="TRYAGAIN"):
        other.acquire(name, blocking=False)
    with pytest.raises((LockContended, LockNotAcquired), match="TRYAGAIN"):
        other.rwlock(name).write(blocking=False)
    for node in nodes:
        source = node.serving(slot)
        target = next(master for master in node.masters if master is not source)
        node.move_keys(slot, source, target)
        node.finish_migration(slot, target)
    with pytest.raises(LockContended):
        other.acquire(name, blocking=False)  # the readers moved with their slot
    lease.release()
    gone_everywhere(nodes, cluster_key(PREFIX + name + "\x00r"))
    other.acquire(name, blocking=False).release()


def test_lock_many_across_slots_on_clusters_this_process_never_contacted(unique: str) -> None:
    """The first contact is that lock_many: the asyncio manager (which does not block its
    loop to ask) is refused by the transport on each cluster node, sending nothing, the
    reason naming the slots; the sync manager asks the nodes first and refuses at once."""
    nodes = [LocalShardedNode(1, name=f"n{index}").start() for index in range(3)]
    try:
        names = [f"{unique}a", f"{unique}b"]
        assert key_slot(cluster_key(PREFIX + names[0])) != key_slot(cluster_key(PREFIX + names[1]))

        async def main() -> None:
            manager = AsyncLockManager([node.url for node in nodes], ttl=30.0)
            with pytest.raises(QuorumUnreachable, match="hash tag"):
                await manager.lock_many(names, blocking=False)

        asyncio.run(main())
        fresh = [LocalShardedNode(1, name=f"o{index}").start() for index in range(3)]
        nodes += fresh
        with pytest.raises(ValueError, match="hash tag"):
            _manager(fresh).lock_many(names, blocking=False)
        for node in nodes:
            with node.client(node.masters[0]) as client:
                assert not list(client.scan_iter(match=f"*{unique}*"))
    finally:
        for node in nodes:
            node.stop()
