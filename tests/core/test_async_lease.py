"""AsyncLease is its own type: ``async with`` releases it, a plain ``with`` is refused (issue 14,
point 5), and it keeps the public attributes of a Lease."""

from __future__ import annotations

import asyncio
import inspect
import time

import pytest

from django_redlock import AsyncLease, Lease, LockContended, LockManager
from django_redlock.aredlock import AsyncLockManager
from tests.helpers import node_client


def keys_left(cluster, key: str) -> int:
    """On how many nodes ``key`` exists."""
    left = 0
    for node in cluster:
        with node_client(node) as client:
            left += client.exists(key)
    return left


def test_async_with_releases_an_auto_extended_lease(cluster3):
    async def main() -> None:
        manager = AsyncLockManager(cluster3.urls)
        async with await manager.acquire("form:a", ttl=10.0, auto_extend=True) as lease:
            assert (lease.released, lease.auto_extended) == (False, True)
            # Granted at a quorum: the third node's SET may still be on its way.
            assert keys_left(cluster3, lease.key) >= 2
        assert (lease.released, lease.auto_extended) == (True, False)
        assert keys_left(cluster3, lease.key) == 0
        async with manager.lock("form:b", ttl=10.0, auto_extend=True) as other:
            assert isinstance(other, AsyncLease)
        assert keys_left(cluster3, other.key) == 0

    asyncio.run(main())


def test_a_plain_with_is_refused_and_does_not_keep_the_lock(cluster3):
    """Before: the sync ``__exit__`` made a release coroutine nobody awaited, so the lock
    stayed held (and renewed) until the process ended."""

    async def main() -> None:
        manager = AsyncLockManager(cluster3.urls)
        lease = await manager.acquire("form:c", ttl=10.0, auto_extend=True)
        with pytest.raises(TypeError, match="async with"), lease:
            pytest.fail("the block must not run")  # pragma: no cover
        # The misused lease is given back in the background: another manager gets the
        # lock long before its 10 s ttl (let alone renewals) would have freed it.
        started = time.monotonic()
        other = await AsyncLockManager(cluster3.urls).acquire("form:c", ttl=10.0, timeout=8.0)
        assert time.monotonic() - started < 8.0
        await other.release()

    asyncio.run(main())


def test_it_has_the_public_attributes_of_a_lease_and_coroutines_for_io(cluster3):
    async def main() -> None:
        manager = AsyncLockManager(cluster3.urls)
        lease = await manager.acquire("form:d", ttl=10.0)
        assert Lease not in type(lease).__mro__  # code typed for a Lease never gets one
        assert lease.name == "form:d"
        assert lease.key == "redlock:form:d"
        assert len(lease.token) == 40
        assert lease.token not in repr(lease)
        assert repr(lease).startswith("<AsyncLease 'form:d' held")
        assert 9.0 < lease.validity <= 10.0
        assert lease.fencing_token is None
        assert (lease.lost, lease.released) == (False, False)
        lease.check()
        assert inspect.iscoroutinefunction(AsyncLease.extend)
        assert inspect.iscoroutinefunction(AsyncLease.release)
        assert await lease.extend() > 9.0
        await lease.release()
        assert (lease.released, lease.depth) == (True, 0)

    asyncio.run(main())


def test_a_sync_acquire_in_the_same_task_does_not_reenter_an_async_lease(cluster3):
    """Re-entry hands back the caller's own kind of lease only: a ``Lease`` from
    ``LockManager.acquire``, never an ``AsyncLease`` whose release a plain ``with`` skips."""

    async def main() -> None:
        manager = AsyncLockManager(cluster3.urls)
        async with await manager.acquire("form:e", ttl=10.0) as lease:
            assert await manager.acquire("form:e") is lease
            with pytest.raises(LockContended):
                LockManager.sharing(manager).acquire("form:e", blocking=False)
            await lease.release()
        assert lease.released
        LockManager(cluster3.urls).acquire("form:e", blocking=False).release()

    asyncio.run(main())


def test_a_reentrant_acquire_checks_its_arguments_like_a_first_one(cluster3):
    """The asyncio twin of issue 14, point 3: ``ttl=-1`` was refused only on a first acquire;
    a re-entry took the lease again without looking at its arguments."""

    async def main() -> None:
        manager = AsyncLockManager(cluster3.urls)
        async with manager.lock("form:f", ttl=10.0) as lease:
            with pytest.raises(ValueError, match="ttl"):
                await manager.acquire("form:f", ttl=-1)
            with pytest.raises(TypeError, match="blocking"):
                await manager.acquire("form:f", blocking="yes")  # type: ignore[arg-type]
            assert lease.depth == 1
        assert lease.released

    asyncio.run(main())
