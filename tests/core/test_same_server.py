"""Two addresses of one server count as one node (issue 40, item 2): three databases of one
server listed as three nodes make no quorum, and the error names them. Real nodes."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from django_redlock import AsyncLockManager, LockManager, QuorumUnreachable
from django_redlock.core.lease import HELD, BaseLease
from django_redlock.localnodes import LocalCluster
from django_redlock.wire.errors import TIMED_OUT
from django_redlock.wire.nodes import parse_node
from django_redlock.wire.rounds import Round
from django_redlock.wire.scripts import PING
from tests.helpers import node_client


def alias(url: str, name: str) -> str:
    """Another address of the server at unix socket ``url``: a symlink to its socket, as a DNS
    name beside an IP is for a TCP node. Nothing in the two URLs tells them apart: only the
    server's run_id, at first contact."""
    path = Path(url.removeprefix("unix://").split("?", 1)[0])
    other = path.with_name(f"{name}.sock")
    if not other.exists():
        other.symlink_to(path)
    return url.replace(str(path), str(other))


def test_two_databases_of_one_server_are_refused_when_the_manager_is_made(cluster3):
    a, b = cluster3.urls[0], cluster3.urls[1]
    one = a.split("?", 1)[0]
    with pytest.raises(ValueError, match="two databases of one server") as refused:
        LockManager([f"{one}?db=0", f"{one}?db=1", b])
    assert parse_node(f"{one}?db=0").label in str(refused.value)
    assert parse_node(f"{one}?db=1").label in str(refused.value)
    with pytest.raises(ValueError, match="two databases of one server"):
        AsyncLockManager([f"{one}?db=0", f"{one}?db=1", b])


def test_one_server_listed_three_times_never_makes_a_quorum(cluster3):
    url = cluster3.urls[0]
    manager = LockManager([url, alias(url, "a1"), alias(url, "a2")], node_timeout=0.5)
    with pytest.raises(QuorumUnreachable) as refused:
        manager.acquire("fake", blocking=False)
    assert refused.value.votes < 2  # A alone: the aliases, once known, are not even asked
    text = str(refused.value)
    assert "same server as" in text
    assert "not an independent node" in text
    with node_client(cluster3[0]) as client:  # nothing left behind
        assert client.keys("redlock:fake*") == []
    manager.close()


def test_a_quorum_must_come_from_different_servers(cluster3):
    a, b = cluster3.urls[0], cluster3.urls[1]
    manager = LockManager([a, alias(a, "a1"), b], node_timeout=0.5)
    with cluster3[1].paused_while(), pytest.raises(QuorumUnreachable) as refused:
        manager.acquire("one-server", blocking=False)  # a twice: one server, not two nodes
    assert refused.value.votes == 1
    assert "same server as" in str(refused.value)
    manager.close()


def test_the_asyncio_manager_counts_servers_too(cluster3):
    url = cluster3.urls[0]

    async def take() -> None:
        nodes = [url, alias(url, "a1"), alias(url, "a2")]
        manager = AsyncLockManager(nodes, node_timeout=0.5)
        with pytest.raises(QuorumUnreachable, match="same server as"):
            await manager.acquire("fake", blocking=False)
        await manager.aclose()

    asyncio.run(take())


def held_by(lease: BaseLease) -> tuple[bool, ...]:
    """Which nodes hold ``lease``: those that granted, or whose reply was not waited for."""
    held = lease._state[HELD]
    assert held is not None
    return held


def four_servers_five_names(cluster5: LocalCluster) -> list[str]:
    """[A, A's alias, B, C, D]: five node URLs, four servers (quorum 3 of the five names)."""
    a, b, c, d = cluster5.urls[:4]
    return [a, alias(a, "twin"), b, c, d]


def test_an_alias_is_sent_nothing_once_known_so_each_round_waits_for_other_servers(cluster5):
    # Before, the alias was asked like any node: A, its alias and B granting first ended the
    # round with "a quorum" of two servers, and the acquire failed (about 1 in 4 here).
    manager = LockManager(four_servers_five_names(cluster5), node_timeout=0.5)
    manager.acquire("first-contact", blocking=False).release()  # the hellos name the servers
    for attempt in range(20):
        lease = manager.acquire(f"alias-{attempt}", blocking=False)
        assert held_by(lease)[1] is False  # the alias was not asked: no grant heard or assumed
        assert sum(held_by(lease)) >= 3
        lease.release()
    manager.close()


def test_a_quorum_without_the_alias_is_refused_and_the_error_names_it(cluster5):
    manager = LockManager(four_servers_five_names(cluster5), node_timeout=0.5)
    manager.acquire("first-contact", blocking=False).release()
    paused = cluster5[2].paused_while(), cluster5[3].paused_while()
    with paused[0], paused[1], pytest.raises(QuorumUnreachable) as refused:
        manager.acquire("two-servers", blocking=False)  # A (twice) and B: two servers
    assert refused.value.votes == 2
    twin = manager.engine.addresses[1].label
    first = manager.engine.addresses[0].label
    assert f"same server as {first}" in refused.value.node_errors[twin]
    assert "not asked" in refused.value.node_errors[twin]
    manager.close()


def test_the_asyncio_manager_sends_an_alias_nothing_too(cluster5):
    async def take() -> None:
        manager = AsyncLockManager(four_servers_five_names(cluster5), node_timeout=0.5)
        await (await manager.acquire("first-contact", blocking=False)).release()
        for attempt in range(10):
            lease = await manager.acquire(f"alias-{attempt}", blocking=False)
            assert held_by(lease)[1] is False
            await lease.release()
        await manager.aclose()

    asyncio.run(take())


def test_a_first_round_counts_one_yes_per_server_before_the_hellos_told_them_apart(cluster5):
    # New connections: every node's command waits behind its hello, so A and its alias are
    # both sent this round, and both answer. With C and D paused the yes come from A (twice)
    # and B: two servers. Before, the round ended there with "a quorum" of three (the engine
    # then refused the grant: the acquire failed with C and D about to answer; once in CI,
    # stop 47). Now it waits for a third server, and times out here.
    manager = LockManager(four_servers_five_names(cluster5), node_timeout=0.5)
    connections = manager.engine.connections.get()
    with cluster5[2].paused_while(), cluster5[3].paused_while():
        answer = connections.run([PING] * 5, 1.0, b"PONG", 3)
    assert answer.results[:3] == [b"PONG", b"PONG", b"PONG"]
    assert answer.yes == 2
    assert answer.results[3] is TIMED_OUT
    assert manager.engine.servers.twins == {1: (0, manager.engine.addresses[0].label)}
    manager.close()


def test_the_asyncio_transport_counts_one_yes_per_server_too(cluster5):
    async def first_round() -> Round:
        manager = AsyncLockManager(four_servers_five_names(cluster5), node_timeout=0.5)
        try:
            return await manager._connections().run([PING] * 5, 1.0, b"PONG", 3)
        finally:
            await manager.aclose()

    with cluster5[2].paused_while(), cluster5[3].paused_while():
        answer = asyncio.run(first_round())
    assert answer.results[:3] == [b"PONG", b"PONG", b"PONG"]
    assert answer.yes == 2
    assert answer.results[3] is TIMED_OUT
