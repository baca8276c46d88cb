"""Cancellation at every await of AsyncLockManager's acquire, extend and release (issue 14,
point 4), with real nodes.

Each test cancels one task at one await, made to stay pending by pausing nodes (SIGSTOP),
by the extender thread having the lease's turn mid-renewal, or by a connection still being
opened; then checks what must hold whatever was cancelled where:

- another auto-extended lease of the same manager (the bystander) is still renewed past its
  ttl: the extender thread, shared by every lease of the process, was not blocked;
- the manager acquires again, the cancelled name included;
- the cancelled lease's keys are gone, or at most live out the ttl they had.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import pytest

from django_redlock import LockManager
from django_redlock.aredlock import AsyncLease, AsyncLockManager
from django_redlock.core import turns
from django_redlock.localnodes import LocalCluster, LocalNode
from tests.helpers import node_client, queued_on_a_majority

pytestmark = pytest.mark.slow

TTL = 3.0  # the bystander's and the cancelled leases' (renewed every second)
SHORT_TTL = 1.5  # a lease whose renewal comes due first (after 0.5 s)
NODE_TIMEOUT = 1.0  # far above the few ms a node stays paused in these tests


def chain(task: asyncio.Task[Any]) -> list[str]:
    """The functions ``task`` is suspended in, outermost first."""
    names = []
    awaited: Any = task.get_coro()
    while awaited is not None:
        frame = getattr(awaited, "cr_frame", None)
        if frame is None:
            break
        names.append(frame.f_code.co_name)
        awaited = awaited.cr_await
    return names


def suspended_in(function: str) -> bool:
    """Some task of the running loop is suspended inside ``function``."""
    return any(function in chain(task) for task in asyncio.all_tasks())


async def until(condition: Callable[[], bool], what: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        await asyncio.sleep(0.002)


async def step_until(condition: Callable[[], bool], what: str) -> None:
    """Let the loop run one step at a time until ``condition``: for states that last only a
    few loop iterations (a connection to a local socket being opened)."""
    for _ in range(1000):
        if condition():
            return
        await asyncio.sleep(0)
    pytest.fail(f"never saw {what}")


async def cancelled(task: asyncio.Task[Any]) -> None:
    """Cancel ``task`` and see it end with CancelledError."""
    assert not task.done(), "the await under test was not pending"
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def key_lives(cluster: Iterable[LocalNode], key: str) -> list[int]:
    """PTTL of ``key`` on every node, in ms (-2: no key)."""
    lives = []
    for node in cluster:
        with node_client(node) as client:
            lives.append(int(client.pttl(key)))
    return lives


async def just_renewed(lease: AsyncLease) -> None:
    """Return right after the extender renewed ``lease``: the next renewal is a third of its
    ttl away, so a short pause of the nodes now never stalls it."""
    before = lease._expires_at
    await until(lambda: lease._expires_at != before, "the bystander is renewed", TTL)


class Case:
    """What a scenario leaves behind: the name whose task was cancelled, and the instant."""

    def __init__(self, name: str, *, ttl: float = TTL) -> None:
        self.name = name
        self.key = f"redlock:{name}"
        self.ttl = ttl
        self.at = 0.0

    async def cancel(self, task: asyncio.Task[Any]) -> None:
        self.at = time.monotonic()
        await cancelled(task)


Scenario = Callable[[AsyncLockManager, LocalCluster, AsyncLease], Awaitable[Case]]


def survive(cluster: LocalCluster, scenario: Scenario) -> None:
    """Run ``scenario`` next to an auto-extended bystander, then check what must hold."""
    manager = AsyncLockManager(cluster.urls, node_timeout=NODE_TIMEOUT)

    async def main() -> None:
        bystander = await manager.acquire("bystander", ttl=TTL, auto_extend=True)
        taken = time.monotonic()
        try:
            case = await scenario(manager, cluster, bystander)
        finally:
            cluster.ensure_running()  # resume what the scenario paused

        # The cancelled lease's keys: gone, or living out at most the ttl they had.
        lives = key_lives(cluster, case.key)
        assert max(lives) <= case.ttl * 1000, lives
        left = case.at + case.ttl + 1.0 - time.monotonic()
        await until(lambda: max(key_lives(cluster, case.key)) == -2, "the keys are gone", left)

        # The manager works, for the cancelled name too.
        again = await manager.acquire(case.name, ttl=TTL, blocking=False)
        await again.release()
        fresh = await manager.acquire("after", ttl=TTL, blocking=False)
        await fresh.release()

        # The bystander is renewed past its ttl: nothing blocked the extender thread. Had
        # the cancellation blocked it, it would have stopped at the cancelled lease's next
        # renewal (a third of a ttl away at most), and the bystander run out a ttl later.
        while time.monotonic() < max(taken, case.at) + TTL / 3 + TTL + 0.5:
            await asyncio.sleep(0.05)
        assert bystander.auto_extended, bystander._lost_reason
        bystander.check()
        assert sum(0 < life <= TTL * 1000 for life in key_lives(cluster, bystander.key)) >= 2
        await bystander.release()

    asyncio.run(main())


# -- acquire ------------------------------------------------------------------------------


def test_acquire_cancelled_while_connecting(cluster3):
    """The opening goes on (shielded, other tasks may wait on it); had it been cut, the
    connection must be marked broken, never left half-open and 'not connected' for good."""

    async def scenario(manager: AsyncLockManager, cluster: LocalCluster, _: Any) -> Case:
        case = Case("connecting")
        await manager.aclose()  # the next command opens new connections
        task = asyncio.create_task(manager.acquire(case.name, ttl=TTL, blocking=False))
        await step_until(lambda: suspended_in("_connect"), "a connection being opened")
        await case.cancel(task)
        return case

    survive(cluster3, scenario)


def test_acquire_cancelled_before_its_connections_open(cluster3):
    """Cancelled at its first await, while the connections it asked for are not yet being
    opened."""

    async def scenario(manager: AsyncLockManager, cluster: LocalCluster, _: Any) -> Case:
        case = Case("before-connecting")
        await manager.aclose()
        task = asyncio.create_task(manager.acquire(case.name, ttl=TTL, blocking=False))
        await asyncio.sleep(0)
        assert "run" in chain(task)
        await case.cancel(task)
        return case

    survive(cluster3, scenario)


def test_acquire_cancelled_while_a_new_manager_first_hears_from_the_nodes(cluster3):
    """A manager's first acquire first hears from the nodes (a round whose answers come after
    each new connection's hello); cancelled there, the manager works after."""

    async def scenario(manager: AsyncLockManager, cluster: LocalCluster, bystander: Any) -> Case:
        case = Case("first-contact")
        fresh = AsyncLockManager(cluster.urls, node_timeout=NODE_TIMEOUT)
        await just_renewed(bystander)
        cluster[1].pause()
        cluster[2].pause()
        task = asyncio.create_task(fresh.acquire(case.name, ttl=TTL, blocking=False))
        await until(
            lambda: chain(task)[:3] == ["acquire", "drive", "run"],
            "the first contact",
        )
        assert fresh.engine.contact() is not None  # still in it
        await case.cancel(task)
        cluster.ensure_running()
        lease = await fresh.acquire(case.name, ttl=TTL, timeout=5.0)
        await lease.release()
        return case

    survive(cluster3, scenario)


def test_acquire_cancelled_while_its_round_waits_for_paused_nodes(cluster3):
    async def scenario(manager: AsyncLockManager, cluster: LocalCluster, bystander: Any) -> Case:
        case = Case("round")
        await just_renewed(bystander)
        cluster[1].pause()
        cluster[2].pause()
        task = asyncio.create_task(manager.acquire(case.name, ttl=TTL, blocking=False))
        await until(lambda: key_lives([cluster[0]], case.key)[0] > 0, "the free node granted it")
        await case.cancel(task)
        return case

    survive(cluster3, scenario)


def test_acquire_cancelled_while_subscribing(cluster3):
    holder = LockManager(cluster3.urls)

    async def scenario(manager: AsyncLockManager, cluster: LocalCluster, bystander: Any) -> Case:
        case = Case("subscribing")
        busy = holder.acquire(case.name, ttl=TTL)
        await just_renewed(bystander)
        cluster[2].pause()  # its SUBSCRIBE confirmation will not come
        task = asyncio.create_task(manager.acquire(case.name, ttl=TTL, timeout=30.0))
        await until(lambda: "subscribe" in chain(task), "the waiter subscribes")
        await asyncio.sleep(0.01)
        assert "subscribe" in chain(task)  # still waiting for the confirmations
        await case.cancel(task)
        cluster[2].resume()
        busy.release()
        case.at = time.monotonic()
        return case

    survive(cluster3, scenario)


def test_acquire_cancelled_while_waiting_in_line(cluster3):
    """Before: the cancelled waiter kept its place at the head of the line, so the release
    woke no one alive and the next waiter waited for that place to lapse (40 s here)."""
    holder = LockManager(cluster3.urls)

    async def scenario(manager: AsyncLockManager, cluster: LocalCluster, _: Any) -> Case:
        case = Case("line")
        slow = AsyncLockManager(cluster.urls, retry_delay=10.0)  # only a wake-up is quick
        busy = holder.acquire(case.name, ttl=TTL)
        first = asyncio.create_task(slow.acquire(case.name, ttl=TTL, timeout=30.0))
        await until(lambda: queued_on_a_majority(cluster, case.name, 1), "first in line")
        second = asyncio.create_task(slow.acquire(case.name, ttl=TTL, timeout=30.0))
        await until(lambda: queued_on_a_majority(cluster, case.name, 2), "second in line")
        await until(
            lambda: chain(first)[:3] == ["acquire", "drive", "wait"],
            "the first one waits",
        )
        await case.cancel(first)
        await until(lambda: queued_on_a_majority(cluster, case.name, 1), "the first left")
        busy.release()
        got = await asyncio.wait_for(second, 5.0)  # woken by the release, not by a poll
        await got.release()
        case.at = time.monotonic()
        return case

    survive(cluster3, scenario)


# -- extend -------------------------------------------------------------------------------


def test_extend_cancelled_while_its_round_waits_for_paused_nodes(cluster3):
    async def scenario(manager: AsyncLockManager, cluster: LocalCluster, bystander: Any) -> Case:
        case = Case("extend-round")
        lease = await manager.acquire(case.name, ttl=TTL)
        await just_renewed(bystander)
        expires = lease._expires_at
        cluster[1].pause()
        cluster[2].pause()
        task = asyncio.create_task(lease.extend())
        await until(lambda: "_extend" in chain(task), "the extend round is out")
        await case.cancel(task)
        cluster.ensure_running()
        # Still held, no longer than before; extended and released as usual.
        assert not lease.lost
        assert lease._expires_at == expires
        assert await lease.extend() > 0
        await lease.release()
        return case

    survive(cluster3, scenario)


def test_extend_cancelled_while_the_extender_renews_the_lease(cluster3):
    async def scenario(manager: AsyncLockManager, cluster: LocalCluster, bystander: Any) -> Case:
        case = Case("extend-guard", ttl=SHORT_TTL)
        await just_renewed(bystander)
        lease = await manager.acquire(case.name, ttl=SHORT_TTL, auto_extend=True)
        assert lease._guard is not None
        cluster[1].pause()
        cluster[2].pause()
        await until(lambda: turns.is_taken(lease), "the extender is renewing it", SHORT_TTL)
        task = asyncio.create_task(lease.extend())
        await asyncio.sleep(0.02)  # the extend now waits for the lease's turn
        assert turns.is_taken(lease)
        await case.cancel(task)
        cluster.ensure_running()
        await until(lambda: not turns.is_taken(lease), "the renewal is over", NODE_TIMEOUT + 1)
        assert lease.auto_extended
        await lease.release()
        return case

    survive(cluster3, scenario)


# -- release ------------------------------------------------------------------------------


def test_release_cancelled_at_once(cluster3):
    """The issue's case. Before: the guard was taken in a worker thread that went on after
    the cancellation and never gave it back; the extender thread blocked on it at this
    lease's next renewal, and every auto-extended lease of the process expired."""

    async def scenario(manager: AsyncLockManager, cluster: LocalCluster, _: Any) -> Case:
        case = Case("release-at-once")
        lease = await manager.acquire(case.name, ttl=TTL, auto_extend=True)
        task = asyncio.create_task(lease.release())
        await asyncio.sleep(0)  # the release reaches its first await
        await case.cancel(task)
        assert lease.released
        return case

    survive(cluster3, scenario)


def test_release_cancelled_while_the_extender_renews_the_lease(cluster3):
    async def scenario(manager: AsyncLockManager, cluster: LocalCluster, bystander: Any) -> Case:
        case = Case("release-guard", ttl=SHORT_TTL)
        await just_renewed(bystander)
        lease = await manager.acquire(case.name, ttl=SHORT_TTL, auto_extend=True)
        assert lease._guard is not None
        cluster[1].pause()
        cluster[2].pause()
        await until(lambda: turns.is_taken(lease), "the extender is renewing it", SHORT_TTL)
        task = asyncio.create_task(lease.release())
        await asyncio.sleep(0.02)  # the release now waits for the lease's turn
        assert turns.is_taken(lease)
        await case.cancel(task)
        return case

    survive(cluster3, scenario)


def test_release_cancelled_while_its_round_waits_for_paused_nodes(cluster3):
    async def scenario(manager: AsyncLockManager, cluster: LocalCluster, bystander: Any) -> Case:
        case = Case("release-round")
        lease = await manager.acquire(case.name, ttl=TTL, auto_extend=True)
        await just_renewed(bystander)
        cluster[1].pause()
        cluster[2].pause()
        task = asyncio.create_task(lease.release())
        await until(lambda: suspended_in("_release"), "the release round is out")
        await case.cancel(task)
        return case

    survive(cluster3, scenario)


def test_release_cancelled_while_connecting(cluster3):
    """Shielded: the release still reaches the nodes, so the next holder need not wait out
    the ttl."""

    async def scenario(manager: AsyncLockManager, cluster: LocalCluster, _: Any) -> Case:
        case = Case("release-connecting")
        lease = await manager.acquire(case.name, ttl=TTL, auto_extend=True)
        await manager.aclose()
        task = asyncio.create_task(lease.release())
        await step_until(lambda: suspended_in("_connect"), "a connection being opened")
        await case.cancel(task)
        await until(lambda: max(key_lives(cluster, case.key)) == -2, "released", 2.0)
        return case

    survive(cluster3, scenario)
