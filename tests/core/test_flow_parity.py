"""One flow, two managers: what the asyncio manager does around a round is what the sync one
does, on real nodes (the guard against the extender, the log records of the rarer events,
and the introspection coroutines)."""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import threading
from typing import Any

import pytest

from django_redlock import AsyncLockManager, Lease, LeaseInherited, LockLost, LockManager
from django_redlock.core import turns
from tests.core.test_async_parity import collapsed
from tests.core.test_fork import contended, fork, wait_child
from tests.helpers import node_client, put_lock


def test_an_async_extend_in_a_child_forked_mid_renewal_refuses_at_once(cluster3):
    # As the sync extend: the inherited check comes before the lease's turn, which the
    # parent's extender had at the instant of the fork, so the child's copy is taken for good.
    async def main() -> None:
        manager = AsyncLockManager(cluster3.urls)
        lease = await manager.acquire("async-mid-renewal", ttl=10.0, auto_extend=True)
        assert lease._guard is False  # auto-extended, its turn free
        held, done = threading.Event(), threading.Event()

        def renewing() -> None:
            turns.take(lease)
            try:
                held.set()
                done.wait()
            finally:
                turns.give_back(lease)

        thread = threading.Thread(target=renewing)
        thread.start()
        held.wait()
        try:
            pid = fork()
            if pid == 0:
                code = 1
                try:

                    async def child() -> int:
                        try:
                            await asyncio.wait_for(lease.extend(), 5.0)
                        except LeaseInherited:
                            return 0
                        return 2

                    code = asyncio.new_event_loop().run_until_complete(child())
                finally:
                    os._exit(code)
            status = wait_child(pid, 20.0)
        finally:
            done.set()
            thread.join()
        assert status == 0
        assert contended(cluster3.urls, "async-mid-renewal")  # still the parent's
        await lease.release()

    asyncio.run(main())


def test_an_async_extend_waits_for_the_extenders_renewal(cluster3):
    # The lease's turn serialises the owner's extend with the extender's renewal, sync or
    # asyncio.
    async def main() -> None:
        manager = AsyncLockManager(cluster3.urls)
        lease = await manager.acquire("async-guarded", ttl=10.0, auto_extend=True)
        assert turns.try_take(lease)  # the extender is renewing
        extending = asyncio.ensure_future(lease.extend())
        await asyncio.sleep(0.05)
        assert not extending.done()
        turns.give_back(lease)
        assert await extending > 9.0
        await lease.release()

    asyncio.run(main())


async def done(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


async def leave_block(lease: Any, error: BaseException | None) -> None:
    """Leave the ``with`` (or ``async with``) block of ``lease`` as if its body raised
    ``error`` (None: it ended normally)."""
    kind = None if error is None else type(error)
    if isinstance(lease, Lease):
        lease.__exit__(kind, error, None)
    else:
        await lease.__aexit__(kind, error, None)


async def rare_events(manager: Any, cluster: Any) -> None:
    """Events the issue-14 parity scenario does not reach."""
    # A block that raises, on a lease found gone at release: the block's error wins, the
    # release's is logged.
    lease = await done(manager.acquire("rare:a", ttl=5.0))
    for node in cluster:
        with node_client(node) as client:
            put_lock(client, lease.key, "someone-else")
    await leave_block(lease, KeyError("boom"))  # does not raise: the block's error wins
    for node in cluster:
        with node_client(node) as client:
            client.delete(lease.key)

    # A block that ends normally on a lease lost before its end: LockLost at exit.
    lost = await done(manager.acquire("rare:b", ttl=5.0))
    for node in cluster:
        with node_client(node) as client:
            put_lock(client, lost.key, "someone-else")
    with pytest.raises(LockLost):
        await done(lost.extend())
    for node in cluster:
        with node_client(node) as client:
            client.delete(lost.key)
    with pytest.raises(LockLost):
        await leave_block(lost, None)

    # A release that only a minority answered (two nodes paused): kept, with a warning.
    partial = await done(manager.acquire("rare:c", ttl=5.0))
    cluster[1].pause()
    cluster[2].pause()
    try:
        await done(partial.release())
    finally:
        cluster[1].resume()
        cluster[2].resume()

    # Who holds it, asked of the nodes.
    held = await done(manager.acquire("rare:d", ttl=5.0))
    assert await done(manager.locked("rare:d")) is True
    owner = await done(manager.holder("rare:d"))
    assert owner is not None
    assert owner["nodes"] == 3
    await done(held.release())
    assert await done(manager.locked("rare:d")) is False


def test_the_asyncio_manager_logs_the_rarer_events_as_the_sync_one(cluster3, caplog):
    logs: dict[str, list[tuple[str, str, str]]] = {}
    for path in ("sync", "async"):
        manager: Any = (
            LockManager(cluster3.urls) if path == "sync" else AsyncLockManager(cluster3.urls)
        )
        caplog.clear()
        with caplog.at_level(logging.DEBUG, logger="django_redlock"):
            asyncio.run(rare_events(manager, cluster3))
        logs[path] = collapsed(
            [
                (record.name, record.levelname, str(record.msg))
                for record in caplog.records
                if record.name.startswith("django_redlock")
            ]
        )
    said = {message for _, _, message in logs["sync"]}
    assert "releasing %r after an error: %s" in said
    assert "lease on %r lost: %s" in said
    assert any(message.startswith("released %r on %d/%d nodes") for message in said)
    assert logs["async"] == logs["sync"]


def test_async_locked_and_holder_are_coroutines_on_the_loops_connections(cluster3):
    async def main() -> None:
        manager = AsyncLockManager(cluster3.urls)
        assert inspect.iscoroutinefunction(manager.locked)
        assert inspect.iscoroutinefunction(manager.holder)
        lease = await manager.acquire("async-introspection", ttl=10.0, origin="here")
        owner = await manager.holder("async-introspection")
        assert owner is not None
        assert owner["origin"] == "here"
        assert await manager.locked("async-introspection") is True
        assert manager.open_connections() == 0  # no sync round was run in the loop
        await lease.release()
        assert await manager.holder("async-introspection") is None

    asyncio.run(main())
