"""The asyncio transport's round trips as the lean hot path makes them (issue 25, item 4):
one alarm for the deadlines of every round a task waits for, rounds written before the
first await (``LoopConnections.send_now``), and a release that needs no task of its own
unless its caller is cancelled. Real nodes, paused (SIGSTOP) where a round must wait.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from django_redlock.aredlock import AsyncLockManager
from django_redlock.localnodes import LocalCluster
from django_redlock.wire.errors import TIMED_OUT
from django_redlock.wire.scripts import PING
from tests.helpers import node_client

NODE_TIMEOUT = 1.0  # far above the few ms a paused node is waited for here


async def until(condition: Any, what: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        await asyncio.sleep(0.002)


def test_a_later_round_with_an_earlier_deadline_times_out_at_its_own(cluster3: LocalCluster):
    """One alarm serves every waiting round: a round whose deadline comes before the one the
    alarm is set for moves it earlier, so it is not held until the other round's deadline."""

    async def main() -> None:
        manager = AsyncLockManager(cluster3.urls, node_timeout=NODE_TIMEOUT)
        connections = manager._connections()
        # Every node connected; the alarm is set for a minute from now.
        await connections.run([PING] * 3, 60.0, b"PONG", 3)
        with cluster3[0].paused_while(), cluster3[1].paused_while():
            # Both need all three PONGs; two nodes never answer while paused.
            slow = asyncio.ensure_future(connections.run([PING] * 3, 30.0, b"PONG", 3))
            await asyncio.sleep(0)  # the slow round is out
            quick = asyncio.ensure_future(connections.run([PING] * 3, 0.2, b"PONG", 3))
            # The quick one ends at its deadline, long before any alarm set earlier (the
            # bound is 50 times its timeout: no timing is judged, only which alarm rang).
            done, _ = await asyncio.wait(
                [slow, quick], timeout=10.0, return_when=asyncio.FIRST_COMPLETED
            )
            assert done == {quick}
            assert quick.result().results[:2] == [TIMED_OUT, TIMED_OUT]
            slow.cancel()
        await manager.aclose()

    asyncio.run(main())


def test_rounds_go_out_before_the_first_await_once_connected(cluster3: LocalCluster):
    async def main() -> None:
        manager = AsyncLockManager(cluster3.urls, node_timeout=NODE_TIMEOUT)
        connections = manager._connections()
        # Not connected yet: nothing is sent, the general path (with its awaits) is needed.
        assert connections.send_now([PING] * 3, NODE_TIMEOUT, b"PONG", 3) is None
        await connections.run([PING] * 3, NODE_TIMEOUT, b"PONG", 3)
        sent = connections.send_now([PING] * 3, NODE_TIMEOUT, b"PONG", 3)
        assert sent is not None
        assert (await connections.outcome(sent)).results == [b"PONG"] * 3
        assert sent.closed
        # A node skipped (None) is not waited for.
        sent = connections.send_now([PING, None, PING], NODE_TIMEOUT, b"PONG", 2)
        assert sent is not None
        assert (await connections.outcome(sent)).results == [b"PONG", None, b"PONG"]
        await manager.aclose()

    asyncio.run(main())


class Released:
    """A LockObserver that keeps the leases it heard released, and nothing else."""

    def __init__(self) -> None:
        self.leases: list[Any] = []

    def acquired(self, lease: Any, waited: float) -> None:
        pass

    def released(self, lease: Any, held: float) -> None:
        self.leases.append(lease)

    def extended(self, lease: Any, validity: float) -> None:
        pass

    def lost(self, lease: Any, reason: str) -> None:
        pass

    def gave_up(self, error: Any, waited: float) -> None:
        pass


def test_a_release_cancelled_after_its_send_is_still_judged_and_reported(
    cluster3: LocalCluster,
):
    """A lease that is not auto-extended releases from its caller's task (no shield): once
    cancelled, the rest of its round goes on in a task of its own, which reads the replies,
    judges the round and reports the release; the keys are freed."""
    observer = Released()
    reported = observer.leases

    async def main() -> None:
        manager = AsyncLockManager(cluster3.urls, node_timeout=NODE_TIMEOUT, observer=observer)
        lease = await manager.acquire("cancelled-release", ttl=10.0, blocking=False)
        assert lease._guard is None  # the release path under test
        with cluster3[1].paused_while(), cluster3[2].paused_while():
            task = asyncio.create_task(lease.release())
            await asyncio.sleep(0.05)  # the round is out; a quorum needs a paused node
            assert not task.done()
            assert not reported
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert lease.released
            assert not reported  # still waiting for the paused nodes' replies
        await until(lambda: bool(reported), "the release is reported")
        assert reported == [lease]
        for node in cluster3:
            with node_client(node) as client:
                assert client.exists(lease.key) == 0
        await manager.aclose()

    asyncio.run(main())
