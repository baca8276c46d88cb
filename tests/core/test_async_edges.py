"""The asyncio manager on the edges the sync one was fixed for (issue 14): a forked child's
inherited lease, polls that back off, a capped origin, and a release never skipped by the cap
on owed replies."""

from __future__ import annotations

import asyncio
import gc
import os
import weakref

import pytest

from django_redlock import AsyncLockManager, LeaseInherited, LockContended, LockManager
from django_redlock.redlock import MAX_ORIGIN_BYTES
from tests.core.test_fork import contended, fork, wait_child


def test_a_forked_child_cannot_release_the_parents_async_lease(cluster3):
    async def main() -> None:
        manager = AsyncLockManager(cluster3.urls)
        async with await manager.acquire("async-inherited", ttl=10.0) as lease:
            pid = fork()
            if pid == 0:
                code = 1
                try:
                    # A child with its own loop: release is refused, leaving the block is not.
                    async def child() -> int:
                        with pytest.raises(LeaseInherited):
                            await lease.release()
                        await lease.__aexit__(None, None, None)
                        return 0

                    code = asyncio.new_event_loop().run_until_complete(child())
                finally:
                    os._exit(code)
            assert wait_child(pid) == 0
            assert contended(cluster3.urls, "async-inherited")  # still the parent's

    asyncio.run(main())
    assert not contended(cluster3.urls, "async-inherited")  # released by the parent only


def test_a_blocked_async_waiter_polls_less_and_less(cluster3):
    holder = LockManager(cluster3.urls)
    lease = holder.acquire("async-busy", ttl=30.0)

    async def main() -> int:
        waiter = AsyncLockManager(cluster3.urls, retry_delay=0.01)
        with pytest.raises(LockContended) as gave_up:
            await waiter.acquire("async-busy", ttl=5.0, timeout=2.0)
        return gave_up.value.attempts

    # Well over 100 tries at a fixed 10 ms poll; about 25 at most when backing off (see
    # tests/core/test_overload.py).
    assert asyncio.run(main()) <= 30
    lease.release()


def test_a_huge_async_origin_is_cut(cluster3):
    async def main() -> None:
        manager = AsyncLockManager(cluster3.urls)
        lease = await manager.acquire("async-owner", ttl=10.0, origin="x" * 100_000)
        assert lease.origin is not None
        assert len(lease.origin.encode()) <= MAX_ORIGIN_BYTES
        holder = await manager.holder("async-owner")
        assert holder is not None
        assert holder["origin"] == lease.origin
        # ... and so is the origin a give-up reports.
        with pytest.raises(LockContended) as busy:
            await AsyncLockManager(cluster3.urls).acquire(
                "async-owner", blocking=False, origin="y" * 100_000
            )
        assert busy.value.origin is not None
        assert len(busy.value.origin.encode()) <= MAX_ORIGIN_BYTES
        await lease.release()

    asyncio.run(main())


def test_an_async_release_is_queued_behind_owed_replies_not_skipped(cluster3):
    async def main() -> None:
        manager = AsyncLockManager(cluster3.urls, node_timeout=0.05)
        lease = await manager.acquire("async-owed", ttl=30.0)
        connections = manager._connections()
        cluster3[2].pause()
        try:
            # Node 2 now owes more replies than the cap (fire-and-forget PINGs it cannot
            # answer while paused).
            for _ in range(40):
                connections.post([None, None, (b"*1\r\n$4\r\nPING\r\n", None)])
            await lease.release()  # nodes 0 and 1 answer; node 2's release is queued
        finally:
            cluster3[2].resume()
        node2 = LockManager([cluster3.urls[2]])
        for _ in range(200):  # node 2 applies what it queued while paused
            if node2.holder("async-owed") is None:
                break
            await asyncio.sleep(0.01)
        assert node2.holder("async-owed") is None  # not left there for 30 s

    asyncio.run(main())


def test_asyncio_waiters_on_more_keys_than_kept_lose_no_channel(cluster3):
    """A loop keeps 16 channels subscribed between waits; past that it unsubscribed the oldest
    even while a task still waited on it, leaving that task to its poll. Now only channels
    nobody listens on make room: with 20 tasks waiting on 20 locks, all 20 stay subscribed."""
    keys = [f"kept-{i}" for i in range(20)]

    async def main() -> None:
        manager = AsyncLockManager(cluster3.urls, retry_delay=5.0)
        holder = AsyncLockManager(cluster3.urls)
        held = [await holder.acquire(key, ttl=30.0) for key in keys]
        waiting = [asyncio.create_task(manager.acquire(key, timeout=30.0)) for key in keys]
        subscriber = manager._connections().subscriber

        def all_heard() -> bool:
            listened = set(getattr(subscriber, "listening", {}).values())
            return len(listened) == len(keys) and listened <= set(subscriber.channels)

        for _ in range(1000):  # until every task listens (each subscribes after a try)
            if all_heard():
                break
            await asyncio.sleep(0.01)
        assert len(subscriber.listening) == len(keys)
        assert set(subscriber.listening.values()) <= set(subscriber.channels)
        assert len(subscriber.channels) == len(keys)  # above KEEP: every one is heard
        for lease in held:
            await lease.release()
        leases = await asyncio.gather(*waiting)
        assert sorted(lease.name for lease in leases) == sorted(keys)
        for lease in leases:
            await lease.release()
        assert subscriber.listening == {}
        assert subscriber.listeners == {}
        await manager.aclose()
        await holder.aclose()

    asyncio.run(main())


def test_an_event_loop_that_ended_is_not_kept_by_the_manager(cluster3):
    """A manager used from many short event loops (``asyncio.run`` in a command, asgiref's
    ``async_to_sync`` in a sync view: a new loop per call) keeps none of them once they end:
    their connections were closed at the loop's end, but the task that closes them belongs to
    the loop and was kept with them, so every loop and its connections stayed in memory."""
    manager = AsyncLockManager(cluster3.urls)
    ended = []

    async def use() -> None:
        ended.append(weakref.ref(asyncio.get_running_loop()))
        await (await manager.acquire("short-loop", ttl=10.0)).release()

    for _ in range(3):
        asyncio.run(use())
    gc.collect()
    assert [loop() for loop in ended] == [None, None, None]
    assert len(manager._loops) == 0
    asyncio.run(use())  # a new loop after that still works
