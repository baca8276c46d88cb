"""A pause of the client is not a fault of the nodes (issue 28, item 4).

The client sends a round, then is away longer than the node timeout (a full garbage
collection, a thread holding the GIL, SIGSTOP) while the nodes answer at once: their replies
sit in the client's sockets. When it comes back and finds the deadline passed, it must read
them before it judges any node late, in both transports. The validity is still counted from
before the send (the Redlock spec's step 3): a pause longer than the ttl grants nothing and
the keys that were set are released.

The pause is forced at the one point that matters, between the send and the first look at
the sockets: a sleep after ``ConnectionSet.send_round`` (sync), or an event loop whose next look
at its sockets finds nothing and comes back only after the pause (asyncio: the timer of the
deadline then runs before the loop has read what came during the pause).
"""

from __future__ import annotations

import asyncio
import selectors
import time
from typing import Any

import pytest

from django_redlock import LockManager, QuorumUnreachable
from django_redlock.aredlock import AsyncLockManager
from django_redlock.wire.asyncio.connections import LoopConnections
from django_redlock.wire.scripts import PING
from django_redlock.wire.sync.connections import ConnectionSet
from tests.helpers import lock_token, node_client

NODE_TIMEOUT = 0.05
PAUSE = 6 * NODE_TIMEOUT  # far past the deadline, far below a 10 s lease


def holders(cluster, key: str) -> list[bytes | None]:
    """The token each node holds for ``key`` (None where absent)."""
    tokens = []
    for node in cluster:
        with node_client(node) as client:
            tokens.append(lock_token(client, key))
    return tokens


def released_everywhere(cluster, key: str) -> bool:
    """Whether ``key`` is gone from every node within a few seconds (clean-ups are sent
    without waiting for their replies)."""
    deadline = time.monotonic() + 5
    while holders(cluster, key) != [None] * len(cluster):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def pause_after_next_send(monkeypatch: pytest.MonkeyPatch, seconds: float) -> list[bool]:
    """The next round of any sync manager is sent, then its thread is away for ``seconds``
    before it looks for replies. Returns a flag list: ``[True]`` once the pause happened."""
    send_round = ConnectionSet.send_round
    paused = [False]

    def send_then_pause(self: ConnectionSet, *args: Any, **kwargs: Any) -> Any:
        exchange = send_round(self, *args, **kwargs)
        if not paused[0]:
            paused[0] = True
            time.sleep(seconds)
        return exchange

    monkeypatch.setattr(ConnectionSet, "send_round", send_then_pause)
    return paused


def test_replies_that_came_during_a_client_pause_grant_the_lease_sync(cluster3, monkeypatch):
    manager = LockManager(cluster3.urls, node_timeout=NODE_TIMEOUT)
    manager.acquire("warm-up", ttl=10.0).release()  # connections open: the round is a send
    paused = pause_after_next_send(monkeypatch, PAUSE)
    lease = manager.acquire("paused", ttl=10.0, blocking=False)
    assert paused == [True]
    # Granted, with the pause taken off its validity: counted from before the send.
    assert 0 < lease.validity <= 10.0 - PAUSE
    assert holders(cluster3, lease.key) == [lease.token.encode()] * 3
    lease.release()


def test_a_client_pause_longer_than_the_ttl_grants_nothing_and_releases_sync(cluster3, monkeypatch):
    manager = LockManager(cluster3.urls, node_timeout=NODE_TIMEOUT)
    manager.acquire("warm-up", ttl=10.0).release()
    pause_after_next_send(monkeypatch, 0.8)
    with pytest.raises(QuorumUnreachable, match="nothing left of the lease") as info:
        manager.acquire("too-long", ttl=0.5, blocking=False)
    # A quorum of the nodes' grants was read and counted, not judged timed out (the round may
    # stop at the quorum, leaving the third reply unread) ...
    assert info.value.votes >= 2
    assert "no answer" not in str(info.value)
    # ... and released again.
    assert released_everywhere(cluster3, "redlock:too-long")


class _PausingSelector(selectors.DefaultSelector):
    """The event loop's selector. Set ``armed`` to some seconds: after the next command a
    round writes, the loop's next look at its sockets finds nothing and returns only after
    that long (the loop was away between two looks while the nodes answered)."""

    armed = 0.0
    pause = 0.0
    paused = False

    def select(self, timeout: float | None = None) -> Any:
        if self.pause:
            seconds, self.pause = self.pause, 0.0
            time.sleep(seconds)
            self.paused = True
            return []
        return super().select(timeout)


def run_paused(monkeypatch: pytest.MonkeyPatch, main: Any) -> None:
    """Run ``main(selector)`` to its end on a new event loop with a :class:`_PausingSelector`."""
    selector = _PausingSelector()
    expect = LoopConnections._expect

    def expect_then_pause(self: LoopConnections, *args: Any, **kwargs: Any) -> None:
        expect(self, *args, **kwargs)
        if selector.armed:
            selector.pause, selector.armed = selector.armed, 0.0

    monkeypatch.setattr(LoopConnections, "_expect", expect_then_pause)
    with asyncio.Runner(loop_factory=lambda: asyncio.SelectorEventLoop(selector)) as runner:
        runner.run(main(selector))


def test_replies_that_came_during_a_client_pause_grant_the_lease_asyncio(cluster3, monkeypatch):
    async def main(selector: _PausingSelector) -> None:
        manager = AsyncLockManager(cluster3.urls, node_timeout=NODE_TIMEOUT)
        await (await manager.acquire("warm-up", ttl=10.0)).release()
        selector.armed = PAUSE
        lease = await manager.acquire("paused", ttl=10.0, blocking=False)
        assert selector.paused
        assert 0 < lease.validity <= 10.0 - PAUSE
        assert holders(cluster3, lease.key) == [lease.token.encode()] * 3
        await lease.release()
        await manager.aclose()

    run_paused(monkeypatch, main)


def test_a_client_pause_longer_than_the_ttl_grants_nothing_and_releases_asyncio(
    cluster3, monkeypatch
):
    async def main(selector: _PausingSelector) -> None:
        manager = AsyncLockManager(cluster3.urls, node_timeout=NODE_TIMEOUT)
        await (await manager.acquire("warm-up", ttl=10.0)).release()
        selector.armed = 0.8
        with pytest.raises(QuorumUnreachable, match="nothing left of the lease") as info:
            await manager.acquire("too-long", ttl=0.5, blocking=False)
        assert selector.paused
        assert info.value.votes >= 2
        assert "no answer" not in str(info.value)
        await asyncio.sleep(0.05)  # the clean-up is written at once, its replies read later
        await manager.aclose()

    run_paused(monkeypatch, main)
    assert released_everywhere(cluster3, "redlock:too-long")


def test_a_node_whose_owed_reply_came_during_a_long_pause_keeps_its_connection_sync(cluster3):
    """A node is judged stalled by its oldest owed reply; after a client pause past the stall
    reset that reply sits in the socket, so the connection is read, not replaced."""
    manager = LockManager(cluster3.urls, node_timeout=NODE_TIMEOUT)
    manager.acquire("warm-up", ttl=10.0).release()
    connections = manager.engine.connections.get()
    before = list(connections.connections)
    connections.post([PING] * 3)  # a reply owed by every node, read later
    time.sleep(1.1)  # past the stall reset (max(1 s, 20 node timeouts))
    manager.acquire("after", ttl=10.0, timeout=5.0).release()
    assert all(a is b for a, b in zip(connections.connections, before, strict=True))


def test_a_node_whose_owed_reply_came_during_a_long_pause_keeps_its_connection_asyncio(
    cluster3,
):
    async def main() -> None:
        manager = AsyncLockManager(cluster3.urls, node_timeout=NODE_TIMEOUT)
        await (await manager.acquire("warm-up", ttl=10.0)).release()
        connections = manager._connections()
        before = list(connections.connections)
        connections.post([PING] * 3)
        time.sleep(1.1)  # the event loop blocked past the stall reset
        await (await manager.acquire("after", ttl=10.0, timeout=5.0)).release()
        assert all(a is b for a, b in zip(connections.connections, before, strict=True))
        assert all(conn is not None and conn.broken is None for conn in connections.connections)
        await manager.aclose()

    asyncio.run(main())
