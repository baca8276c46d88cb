"""manager.locks() at any size: a cap chooses which leases are shown, never their node counts."""

from __future__ import annotations

import time

import pytest

from django_redlock import AsyncLockManager, LockManager
from django_redlock.core.listing import list_locks
from tests.helpers import node_client, released_everywhere


def hold_everywhere(manager: LockManager, names: list[str], cluster=None):
    """Hold every lock of ``names`` on every node (an extend waits for every node's answer;
    the acquire returned at a quorum)."""
    lease = manager.lock_many(names, ttl=60.0)
    lease.extend()
    # The extend returns at a quorum of renewals too: on a loaded machine the last node's
    # answer may still be on its way, so wait (bounded) until each node holds every key.
    deadline = time.monotonic() + 10.0
    for node in cluster or ():
        with node_client(node) as client:
            while client.exists(*(manager.engine.key(name) for name in names)) < len(names):
                assert time.monotonic() < deadline, "a node never took every key"
                time.sleep(0.01)
    return lease


def held_on(cluster, key: str) -> int:
    """On how many nodes ``key`` exists, asked of each node directly."""
    count = 0
    for node in cluster:
        with node_client(node) as client:
            count += int(client.exists(key))
    return count


def test_a_capped_listing_never_flags_a_held_lock_partial(cluster3):
    # Each node's SCAN walks its keys in its own hash order: a listing that stopped every
    # node's SCAN at the cap saw each lock on the nodes that happened to reach it first, and
    # flagged most of 400 held locks as leftovers (issue 28).
    manager = LockManager(cluster3.urls, node_timeout=1.0)
    names = [f"held:{index:03d}" for index in range(400)]
    lease = hold_everywhere(manager, names)
    listing = manager.locks("held:", limit=50)
    assert [lock.name for lock in listing.locks] == names[:50]  # the first 50 by name
    assert not any(lock.partial for lock in listing.locks)
    for lock in listing.locks:  # the count each node gives, not the one the cap left
        assert lock.nodes == held_on(cluster3, manager.key(lock.name))
    assert (listing.approx_total, listing.not_shown, listing.truncated) == (400, 350, True)
    lease.release()


def test_leftovers_are_still_partial_under_a_cap(cluster3):
    manager = LockManager(cluster3.urls, node_timeout=1.0)
    lease = hold_everywhere(manager, [f"held:{index:03d}" for index in range(100)], cluster3)
    with node_client(cluster3[0]) as client:  # a failed acquire's key, on one node only
        client.hset("redlock:a-leftover", mapping={"t": "x" * 40, "o": '{"pid": 7}'})
        client.pexpire("redlock:a-leftover", 30_000)
    two = manager.acquire("a-two-nodes", ttl=60.0)
    two.extend()
    with node_client(cluster3[2]) as client:  # a node that lost it: still held on a quorum
        client.delete("redlock:a-two-nodes")
    listing = manager.locks(limit=3)
    seen = [(lock.name, lock.nodes, lock.partial) for lock in listing.locks]
    assert seen == [("a-leftover", 1, True), ("a-two-nodes", 2, False), ("held:000", 3, False)]
    assert listing.locks[0].owner == {"pid": 7}
    assert (listing.approx_total, listing.not_shown) == (102, 99)
    two.release()
    lease.release()


def test_without_a_cap_every_lock_is_listed(cluster3):
    manager = LockManager(cluster3.urls, node_timeout=1.0)
    names = [f"all:{index:04d}" for index in range(1500)]  # more than one script call
    leases = [hold_everywhere(manager, names[:750]), hold_everywhere(manager, names[750:])]
    listing = manager.locks(limit=None)
    assert [lock.name for lock in listing.locks] == names
    assert {lock.nodes for lock in listing.locks} == {3}
    assert (listing.approx_total, listing.not_shown, listing.truncated) == (1500, 0, False)
    assert listing.locks[0].owner == listing.locks[749].owner  # one lease, one owner
    for lease in leases:
        lease.release()
    released_everywhere(manager)


def test_the_asyncio_manager_lists_as_the_sync_one(cluster3):
    # Listing is on no hot path: a plain function on the asyncio manager too.
    manager = AsyncLockManager(cluster3.urls, node_timeout=1.0)
    lease = hold_everywhere(
        LockManager.sharing(manager), [f"held:{index:03d}" for index in range(30)]
    )
    listing = manager.locks("held:", limit=10)
    assert [lock.name for lock in listing.locks] == [f"held:{index:03d}" for index in range(10)]
    assert not any(lock.partial for lock in listing.locks)
    assert listing.not_shown == 20
    with pytest.raises(ValueError, match="limit must be 1 or more"):
        manager.locks(limit=0)
    lease.release()


def test_semaphore_slots_are_in_slot_order_and_the_cap_counts_leases(cluster3):
    manager = LockManager(cluster3.urls, node_timeout=1.0)
    semaphore = manager.semaphore("pool", 12)
    slots = [semaphore.acquire(ttl=60.0) for _ in range(12)]
    for slot in slots:
        slot.extend()
    listing = manager.locks("pool", limit=11)
    assert [lock.slot for lock in listing.locks] == list(range(11))  # 10 after 9, not 1
    assert (listing.approx_total, listing.not_shown) == (12, 1)
    assert not any(lock.partial for lock in listing.locks)
    for slot in slots:
        slot.release()


def test_a_node_that_is_down_is_unreachable_and_counts_in_no_lock(cluster3):
    manager = LockManager(cluster3.urls, node_timeout=1.0)
    lease = hold_everywhere(manager, [f"held:{index}" for index in range(5)])
    cluster3[1].kill()
    listing = list_locks(manager, limit=2, timeout=0.5)
    assert listing.unreachable == [manager.addresses[1].label]
    assert [(lock.nodes, lock.total, lock.partial) for lock in listing.locks] == [(2, 3, False)] * 2
    assert listing.not_shown == 3
    lease.release()


def test_contains_is_matched_on_the_nodes_ignoring_case(cluster3):
    manager = LockManager(cluster3.urls, node_timeout=1.0)
    lease = hold_everywhere(manager, [f"bulk:{index:03d}" for index in range(50)])
    others = [manager.acquire(name, ttl=60.0) for name in ("x:Café", "x:CAFE", "x:a*b")]
    slot = manager.semaphore("api", 2).acquire(ttl=60.0)
    found = list_locks(manager, contains="CAFÉ", limit=1)
    assert [lock.name for lock in found.locks] == ["x:Café"]  # É is matched by * then exactly
    assert (found.not_shown, found.approx_total) == (0, 1)
    assert [lock.name for lock in list_locks(manager, contains="a*").locks] == ["x:a*b"]
    assert list_locks(manager, contains="s0").locks == []  # not the slot's key suffix
    assert list_locks(manager, "x:", contains="x").locks == []  # after the prefix only
    assert [lock.name for lock in list_locks(manager, contains="Bulk:04", limit=5).locks] == [
        f"bulk:04{digit}" for digit in range(5)
    ]
    with pytest.raises(TypeError, match="contains must be a str, not int"):
        list_locks(manager, contains=5)  # type: ignore[arg-type]
    for held in (lease, *others, slot):
        held.release()


@pytest.mark.parametrize(
    ("arguments", "error", "message"),
    [
        ({"limit": 0}, ValueError, "limit must be 1 or more"),
        ({"limit": -5}, ValueError, "limit must be 1 or more"),
        ({"limit": True}, TypeError, "limit must be an int or None, not bool"),
        ({"limit": 2.5}, TypeError, "limit must be an int or None, not float"),
        ({"limit": "10"}, TypeError, "limit must be an int or None, not str"),
        ({"prefix": b"job"}, TypeError, "prefix must be a str, not bytes"),
        ({"prefix": None}, TypeError, "prefix must be a str, not NoneType"),
    ],
)
def test_bad_listing_arguments_name_the_argument(cluster3, arguments, error, message):
    with pytest.raises(error, match=message):
        LockManager(cluster3.urls).locks(**arguments)
