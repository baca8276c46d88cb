"""Introspection: is a lock held, by whom, is my lease still mine, how long is left."""

from __future__ import annotations

import asyncio

import pytest

from django_redlock import AsyncLockManager, LockManager
from tests.helpers import FakeClock, node_client


def test_locked_says_whether_a_quorum_holds_the_lock(cluster3):
    manager = LockManager(cluster3.urls)
    assert manager.locked("report") is False
    lease = manager.acquire("report", ttl=10.0)
    assert manager.locked("report") is True
    assert LockManager(cluster3.urls).locked("report") is True  # anyone can ask
    with node_client(cluster3[0]) as client:
        client.delete(lease.key)
    with node_client(cluster3[1]) as client:
        client.delete(lease.key)
    assert manager.locked("report") is False  # held on one node only: a leftover
    assert lease.owned() is False  # and the holder itself can tell


def test_owned_asks_the_nodes_where_lost_only_knows_this_process(cluster3):
    manager = LockManager(cluster3.urls)
    lease = manager.acquire("job", ttl=10.0)
    assert lease.owned() is True
    LockManager(cluster3.urls).force_release("job")  # an operator, elsewhere
    assert lease.lost is False  # this process has not noticed...
    assert lease.owned() is False  # ...but the nodes say so
    again = manager.acquire("job2", ttl=10.0)
    again.release()
    assert again.owned() is False  # released


def test_a_key_of_another_type_is_not_owned(cluster3):
    manager = LockManager(cluster3.urls)
    lease = manager.acquire("typed", ttl=10.0)
    for node in cluster3:
        with node_client(node) as client:
            client.set(lease.key, "someone else's")
    assert lease.owned() is False


def test_remaining_is_the_validity_by_the_local_clock(cluster3, clock: FakeClock):
    manager = LockManager(cluster3.urls, clock=clock, sleep=clock.sleep)
    lease = manager.acquire("timer", ttl=10.0)
    assert lease.remaining() == pytest.approx(lease.validity)
    assert 9.8 < lease.remaining() <= 10.0
    clock.advance(4.0)
    assert 5.8 < lease.remaining() <= 6.0
    clock.advance(10.0)
    assert lease.remaining() == 0.0
    assert lease.owned() is False  # past its validity it is never "owned", whatever the nodes say


def test_asyncio_owned_is_a_coroutine_that_asks_the_nodes(cluster3):
    async def main() -> None:
        manager = AsyncLockManager(cluster3.urls)
        lease = await manager.acquire("async-job", ttl=10.0)
        assert await lease.owned() is True
        assert 9.0 < lease.remaining() <= 10.0
        LockManager(cluster3.urls).force_release("async-job")
        assert await lease.owned() is False
        assert await manager.locked("async-job") is False

    asyncio.run(main())
