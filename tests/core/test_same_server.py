"""Two addresses of one server count as one node (issue 40, item 2): three databases of one
server listed as three nodes make no quorum, and the error names them. Real nodes."""

from __future__ import annotations

import asyncio

import pytest

from django_redlock import AsyncLockManager, LockManager, QuorumUnreachable
from django_redlock.core.health import declare_fresh
from django_redlock.wire.nodes import parse_node
from tests.helpers import node_client


def on_db(url: str, db: int) -> str:
    """The same server at another database index (unix:// URLs take it as ?db=), declared
    fresh there too (each database has its own restart marker), so that it would vote."""
    if url.startswith("unix://"):
        url = url.split("?", 1)[0] + f"?db={db}"
    else:
        url = url.rsplit("/", 1)[0] + f"/{db}"
    (done,) = declare_fresh([parse_node(url)], timeout=2.0)
    assert done.declared, done.detail
    return url


def test_one_server_listed_three_times_never_makes_a_quorum(cluster3):
    url = cluster3.urls[0]
    manager = LockManager([on_db(url, 0), on_db(url, 1), on_db(url, 2)], node_timeout=0.5)
    with pytest.raises(QuorumUnreachable) as refused:
        manager.acquire("fake", blocking=False)
    assert refused.value.votes == 1
    text = str(refused.value)
    assert "same server as" in text
    assert "not an independent node" in text
    for db in range(3):  # nothing left behind on any database
        with node_client(cluster3[0]) as client:
            client.execute_command("SELECT", db)
            assert client.keys("redlock:fake*") == []
    manager.close()


def test_a_quorum_must_come_from_different_servers(cluster3):
    a, b = cluster3.urls[0], cluster3.urls[1]
    manager = LockManager([on_db(a, 0), on_db(a, 1), b], node_timeout=0.5)
    with cluster3[1].paused_while(), pytest.raises(QuorumUnreachable) as refused:
        manager.acquire("one-server", blocking=False)  # a twice: one server, not two nodes
    assert refused.value.votes == 1
    assert "same server as" in str(refused.value)
    manager.close()


def test_the_asyncio_manager_counts_servers_too(cluster3):
    url = cluster3.urls[0]

    async def take() -> None:
        manager = AsyncLockManager([on_db(url, 0), on_db(url, 1), on_db(url, 2)], node_timeout=0.5)
        with pytest.raises(QuorumUnreachable, match="same server as"):
            await manager.acquire("fake", blocking=False)
        await manager.aclose()

    asyncio.run(take())
