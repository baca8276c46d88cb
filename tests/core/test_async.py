"""AsyncLockManager: the same semantics on asyncio, against real nodes."""

from __future__ import annotations

import asyncio
import time

import pytest

from django_redlock import LockContended, LockLost, LockManager, QuorumUnreachable
from django_redlock.aredlock import AsyncLease, AsyncLockManager
from tests.helpers import node_client, put_lock, queued_on_a_majority


def run(coroutine):
    return asyncio.run(coroutine)


def test_acquire_release_and_contention_with_the_sync_manager(cluster5):
    async def main() -> None:
        manager = AsyncLockManager(cluster5.urls)
        lease = await manager.acquire("a", ttl=10.0)
        assert isinstance(lease, AsyncLease)
        assert lease.validity > 9.0
        with pytest.raises(LockContended):
            LockManager(cluster5.urls).acquire("a", blocking=False)
        assert await lease.extend() > 9.0
        await lease.release()
        assert lease.released
        LockManager(cluster5.urls).acquire("a", blocking=False).release()
        await manager.aclose()

    run(main())


def test_the_async_context_manager_and_lock_lost(cluster3):
    async def main() -> None:
        manager = AsyncLockManager(cluster3.urls)
        async with manager.lock("ctx", ttl=10.0) as lease:
            assert not lease.lost
        assert lease.released

        async def taken_over() -> None:
            async with manager.lock("gone", ttl=10.0) as lease:
                for node in cluster3:
                    with node_client(node) as client:
                        put_lock(client, lease.key, "someone-else")

        with pytest.raises(LockLost):
            await taken_over()

    run(main())


def test_a_blocking_acquire_waits_for_the_holder(cluster3):
    async def main() -> None:
        manager = AsyncLockManager(cluster3.urls, retry_delay=0.01)
        holder = await manager.acquire("wait", ttl=10.0)

        async def release_soon() -> None:
            await asyncio.sleep(0)  # let the waiter make its first attempt
            await holder.release()

        async def other_task() -> AsyncLease:
            return await manager.acquire("wait", ttl=10.0, timeout=5.0)

        waiting = asyncio.create_task(other_task())
        await release_soon()
        second = await waiting
        assert second is not holder
        await second.release()

    run(main())


def test_reentry_is_per_task(cluster3):
    async def main() -> None:
        manager = AsyncLockManager(cluster3.urls)
        lease = await manager.acquire("nested", ttl=10.0)
        assert await manager.acquire("nested", ttl=10.0) is lease
        assert lease.depth == 2

        async def other() -> str:
            try:
                await manager.acquire("nested", blocking=False)
            except LockContended:
                return "contended"
            return "acquired"

        assert await asyncio.create_task(other()) == "contended"
        await lease.release()
        await lease.release()
        assert lease.released

    run(main())


def test_a_paused_minority_is_tolerated_and_a_majority_fails_fast(cluster5):
    async def main() -> None:
        manager = AsyncLockManager(cluster5.urls, node_timeout=0.05)
        cluster5[0].pause()
        cluster5[1].pause()
        for attempt in range(10):
            lease = await manager.acquire(f"m{attempt}", ttl=5.0)
            await lease.release()
        cluster5[2].pause()
        started = time.monotonic()
        with pytest.raises(QuorumUnreachable):
            await manager.acquire("down", blocking=False)
        assert time.monotonic() - started < 0.5

    run(main())


def test_evalsha_falls_back_after_a_script_flush(cluster3):
    async def main() -> None:
        manager = AsyncLockManager(cluster3.urls)
        await (await manager.acquire("warm", ttl=5.0)).release()
        for node in cluster3:
            with node_client(node) as client:
                client.script_flush()
        await (await manager.acquire("after", ttl=5.0)).release()

    run(main())


def test_a_task_cancelled_during_acquire_leaves_no_key_behind(cluster3):
    """Cancelled while two nodes sit on its SET (SIGSTOP): once they wake, no key remains."""
    manager = AsyncLockManager(cluster3.urls, node_timeout=5.0)

    async def main() -> None:
        # The manager's first contact with the nodes comes before its first acquire.
        await (await manager.acquire("warm-up", ttl=10.0)).release()
        cluster3[1].pause()
        cluster3[2].pause()
        task = asyncio.create_task(manager.acquire("cancelled", ttl=30.0, blocking=False))
        # The free node has granted it: the attempt is now waiting on the paused ones.
        with node_client(cluster3[0]) as client:
            deadline = time.monotonic() + 5
            while not client.exists("redlock:cancelled"):
                assert time.monotonic() < deadline, "the acquire never reached the free node"
                await asyncio.sleep(0.005)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    try:
        asyncio.run(main())
    finally:
        cluster3[1].resume()
        cluster3[2].resume()
    deadline = time.monotonic() + 5
    while True:
        left = [node.url for node in cluster3 if node_client(node).exists("redlock:cancelled")]
        if not left:
            break
        assert time.monotonic() < deadline, f"left behind on {left}"
        time.sleep(0.01)


SLOW_POLL = 10.0  # only a release notification can wake these waiters within the test's time


async def queued(cluster, name: str, length: int) -> None:
    deadline = time.monotonic() + 5
    while not queued_on_a_majority(cluster, name, length):
        assert time.monotonic() < deadline, f"the line of {name!r} never reached {length}"
        await asyncio.sleep(0.002)


def test_async_waiters_are_woken_by_the_release_in_line_order(cluster3):
    """Fresh keys (a new subscription each time, racing the release) and one key again and
    again (the subscription kept): every hand-off comes from the release, never the poll."""
    holder = AsyncLockManager(cluster3.urls)
    waiters = AsyncLockManager(cluster3.urls, retry_delay=SLOW_POLL)

    async def main() -> None:
        for name in [f"fresh{i}" for i in range(5)] + ["again"] * 5:
            lease = await holder.acquire(name, ttl=30.0)
            order: list[int] = []

            async def wait(index: int, name: str = name, order: list[int] = order) -> None:
                got = await waiters.acquire(name, ttl=30.0, timeout=60.0)
                order.append(index)
                await got.release()

            tasks = []
            for index in range(3):  # three tasks of one loop, queued in this order
                tasks.append(asyncio.create_task(wait(index)))
                await queued(cluster3, name, index + 1)
            await lease.release()
            await asyncio.wait_for(asyncio.gather(*tasks), 5.0)
            assert order == [0, 1, 2], name

    run(main())
