"""A total outage fails fast (issue 40, item 3): when the nodes refuse connections outright,
no quorum is possible, and an acquire gives up after a second round one node timeout later
instead of retrying until its timeout (a web worker stalled 10 s under `lock_for`). Real
nodes, stopped; attempts are counted, never seconds."""

from __future__ import annotations

import asyncio
import threading

import pytest

from django_redlock import AsyncLockManager, LockManager, QuorumUnreachable
from django_redlock.localnodes import LocalCluster, _free_port


def test_nodes_that_refuse_connections_fail_an_acquire_after_two_rounds():
    with LocalCluster(3) as cluster:
        urls = cluster.urls
    # Stopped: the unix sockets are gone ("no such file or directory").
    manager = LockManager(urls, node_timeout=0.05, retry_delay=0.05)
    with pytest.raises(QuorumUnreachable) as refused:
        manager.acquire("outage", timeout=30.0)
    assert refused.value.attempts == 2
    assert "the nodes refuse connections" in str(refused.value)
    assert "timeout=None waits for them" in str(refused.value)
    # Why it gave up is said once, not as a node's error: every key of node_errors is a node.
    assert set(refused.value.node_errors) == {address.label for address in manager.addresses}
    assert "the nodes refuse connections" in refused.value.reason


def test_tcp_nodes_that_refuse_connections_fail_fast_in_asyncio_too():
    urls = [f"redis://127.0.0.1:{_free_port()}/0" for _ in range(3)]  # nothing listens

    async def take() -> QuorumUnreachable:
        manager = AsyncLockManager(urls, node_timeout=0.05, retry_delay=0.05)
        with pytest.raises(QuorumUnreachable) as refused:
            await manager.acquire("outage", timeout=30.0)
        return refused.value

    error = asyncio.run(take())
    assert error.attempts == 2
    assert "the nodes refuse connections" in str(error)


def test_one_node_of_three_down_changes_nothing(cluster3):
    cluster3[0].kill()
    manager = LockManager(cluster3.urls, node_timeout=0.2)
    manager.acquire("one-down", timeout=5.0).release()


def test_a_caller_who_asked_to_wait_waits_for_the_nodes_to_come_back(cluster3):
    for node in cluster3:
        node.kill()
    manager = LockManager(cluster3.urls, node_timeout=0.05, retry_delay=0.05)
    came_back = threading.Event()
    restarted: list[BaseException | None] = []

    def restart() -> None:
        came_back.wait()
        try:
            for node in cluster3:
                node.start(fresh=True)
        except BaseException as error:  # reported below, not lost with the thread
            restarted.append(error)
            raise
        restarted.append(None)

    starter = threading.Thread(target=restart, daemon=True)
    starter.start()
    # The first refused rounds are the cue to bring the nodes back (no sleep): the acquire
    # keeps trying with timeout=None, and gets the lock once they answer.
    original = manager.engine.reporter.attempt_failed
    errors: list[BaseException] = []

    def failed(error: BaseException) -> None:
        came_back.set()
        errors.append(error)
        original(error)  # type: ignore[arg-type]

    manager.engine.reporter.attempt_failed = failed  # type: ignore[method-assign]
    lease = manager.acquire("waits", timeout=None)
    starter.join()
    assert restarted == [None]
    assert came_back.is_set()  # it was refused first, and waited instead of giving up
    lease.release()


def test_a_name_that_does_not_resolve_is_a_plain_refusal():
    import socket

    from django_redlock.procedures.flow import plainly_refusing
    from django_redlock.wire.errors import NotSent
    from django_redlock.wire.setup import describe

    # getaddrinfo's codes are negative, not errno values: os.strerror would say "unknown".
    text = describe(socket.gaierror(socket.EAI_NONAME, "Name or service not known"))
    assert text == "name or service not known"
    assert plainly_refusing([NotSent(f"cannot resolve db.invalid: {text}")] * 2) == 2
    assert plainly_refusing([NotSent("no answer within 50 ms")]) == 0  # a timeout is not


def test_a_node_down_and_one_quarantined_past_the_timeout_fail_fast_too():
    """A rolling restart of plain nodes (issue 40's walk): one node refuses connections, one
    was just restarted and is quarantined for longer than the caller waits, one votes. No
    quorum is possible before the timeout: two rounds, not one every retry delay."""
    with LocalCluster(3) as cluster:
        cluster[0].stop()
        cluster[1].restart()  # plain: quarantined for max_ttl (60 s)
        manager = LockManager(cluster.urls, node_timeout=0.2, retry_delay=0.05)
        try:
            with pytest.raises(QuorumUnreachable) as refused:
                manager.acquire("rolling", timeout=10.0)
        finally:
            manager.close()
    assert refused.value.attempts == 2
    assert "1 vote again only after the timeout (quarantined)" in refused.value.reason


def test_a_node_down_and_one_quarantined_within_the_timeout_are_waited_for():
    """The same with a quarantine shorter than the caller's timeout: it waits for it (the
    rule is about what cannot happen in time, not about any refusal). Nodes of its own: a
    node that heard a longer quarantine from another test's manager would teach it."""
    with LocalCluster(3) as cluster:
        cluster[0].stop()
        cluster[1].restart()  # plain: quarantined for the max_ttl its first client sends
        manager = LockManager(
            cluster.urls, ttl=1.0, node_timeout=0.2, retry_delay=0.05, max_ttl=2.0
        )
        try:
            manager.acquire("rolling", timeout=10.0).release()
        finally:
            manager.close()
