"""Wire faults, sync and asyncio, on real nodes: a connection that stays open and never
answers (a black hole), a node that answers bytes that are not RESP, a node that lost its
scripts (NOSCRIPT), a busy node that is not a stalled one, and a task cancelled while it
reconnects.

Faults a real server cannot produce come from :class:`tests.helpers.FaultServer`, a small
TCP listener in front of a real node (or answering on its own).
"""

from __future__ import annotations

import asyncio
import time

import pytest

from django_redlock import LockManager, LockNotAcquired, QuorumUnreachable
from django_redlock.aredlock import AsyncLockManager
from django_redlock.localnodes import DURABLE_ARGS, LocalCluster
from django_redlock.wire.errors import NotSent
from django_redlock.wire.scripts import HOT_SCRIPTS
from django_redlock.wire.sync.connections import ConnectionSet
from tests.core.test_async_cancel import cancelled, chain, step_until
from tests.helpers import FakeClock, FaultServer, lock_token, node_client

# A port nothing listens on: the node it names refuses at once, so the quorum of two out of
# three needs both other nodes.
REFUSED = "redis://127.0.0.1:1/0"
PING = (b"*1\r\n$4\r\nPING\r\n", None)
# Long enough for a replaced connection and its round trips on a loaded machine; a node
# that is never replaced would make every try fail for all of it.
RECOVERY = 10.0
LONG_TTL = 60.0  # far beyond the test: a key left behind stays


def pairs_until_one_succeeds(manager: LockManager, name: str) -> int:
    """Acquire + release ``name`` until a pair succeeds; the failed tries before it."""
    failures = 0
    deadline = time.monotonic() + RECOVERY
    while True:
        try:
            manager.acquire(name, ttl=5.0, blocking=False).release()
            return failures
        except LockNotAcquired:
            failures += 1
            assert time.monotonic() < deadline, f"no success in {RECOVERY} s ({failures} tries)"


# -- a black hole ---------------------------------------------------------------------------


def test_a_black_hole_connection_is_replaced_sync(cluster3):
    # Node 0 is reached through a fault server; once its connection turns into a black hole
    # (open, never answering), only a new connection brings its vote back.
    with FaultServer(upstream=cluster3[0].socket_path) as hole:
        manager = LockManager([hole.url, cluster3[1].url, REFUSED])
        manager.acquire("before", ttl=5.0).release()
        hole.black_hole()
        pairs_until_one_succeeds(manager, "after")
        assert hole.accepted >= 2  # the black-holed connection was replaced
        manager.close()


def test_a_black_hole_connection_is_replaced_asyncio(cluster3):
    async def main(hole: FaultServer) -> None:
        manager = AsyncLockManager([hole.url, cluster3[1].url, REFUSED])
        await (await manager.acquire("before", ttl=5.0)).release()
        hole.black_hole()
        deadline = time.monotonic() + RECOVERY
        tries = 0
        while True:
            tries += 1
            try:
                await (await manager.acquire("after", ttl=5.0, blocking=False)).release()
                break
            except LockNotAcquired:
                assert time.monotonic() < deadline, f"no success in {RECOVERY} s ({tries})"
        assert hole.accepted >= 2
        await manager.aclose()

    with FaultServer(upstream=cluster3[0].socket_path) as hole:
        asyncio.run(main(hole))


# -- replies that are not RESP --------------------------------------------------------------

NOT_RESP = b"HTTP/1.1 400 Bad Request\r\n\r\n"


def test_a_reply_that_is_not_resp_is_a_node_failure_sync(cluster3):
    with FaultServer(reply=NOT_RESP) as one, FaultServer(reply=NOT_RESP) as two:
        manager = LockManager([cluster3[0].url, one.url, two.url])
        for _ in range(3):  # and again on the replaced connections
            with pytest.raises(QuorumUnreachable, match="not RESP"):
                manager.acquire("garbage", blocking=False)
        manager.close()
    with FaultServer(reply=NOT_RESP) as one:  # a minority of such nodes costs nothing
        manager = LockManager([cluster3[0].url, cluster3[1].url, one.url])
        manager.acquire("garbage", ttl=5.0).release()
        manager.close()


def test_a_reply_that_is_not_resp_is_a_node_failure_asyncio(cluster3):
    async def main(one: FaultServer, two: FaultServer) -> None:
        manager = AsyncLockManager([cluster3[0].url, one.url, two.url])
        for _ in range(3):
            with pytest.raises(QuorumUnreachable, match="not RESP"):
                await manager.acquire("garbage", blocking=False)
        await manager.aclose()
        manager = AsyncLockManager([cluster3[0].url, cluster3[1].url, one.url])
        await (await manager.acquire("garbage", ttl=5.0)).release()
        await manager.aclose()

    with FaultServer(reply=NOT_RESP) as one, FaultServer(reply=NOT_RESP) as two:
        asyncio.run(main(one, two))


# -- NOSCRIPT -------------------------------------------------------------------------------


def all_scripts_loaded(cluster: LocalCluster) -> bool:
    """Every hot script is in every node's script cache."""
    loaded = []
    for node in cluster:
        with node_client(node) as client:
            loaded.extend(client.script_exists(*(script.sha for script in HOT_SCRIPTS)))
    return all(loaded)


def flush_scripts(cluster: LocalCluster) -> None:
    for node in cluster:
        with node_client(node) as client:
            client.script_flush()


def test_after_script_flush_eval_is_used_and_the_scripts_are_loaded_again_sync(cluster3):
    manager = LockManager(cluster3.urls)
    manager.acquire("warm", ttl=5.0).release()
    flush_scripts(cluster3)
    # NOSCRIPT, then EVAL. A node outside the quorum answers after the pair returned; its
    # late NOSCRIPT is read by a later pair, and loads the scripts all the same.
    deadline = time.monotonic() + 5
    while True:
        manager.acquire("after-flush", ttl=5.0).release()
        if all_scripts_loaded(cluster3):
            break
        assert time.monotonic() < deadline, "the scripts were not loaded again"
    manager.close()


def test_after_script_flush_eval_is_used_and_the_scripts_are_loaded_again_asyncio(cluster3):
    async def main() -> None:
        manager = AsyncLockManager(cluster3.urls)
        await (await manager.acquire("warm", ttl=5.0)).release()
        flush_scripts(cluster3)
        await (await manager.acquire("after-flush", ttl=5.0)).release()
        deadline = time.monotonic() + 5
        while not all_scripts_loaded(cluster3):  # a node outside the quorum may be late
            assert time.monotonic() < deadline, "the scripts were not loaded again"
            await asyncio.sleep(0.02)
        await manager.aclose()

    asyncio.run(main())


# -- busy is not stalled --------------------------------------------------------------------


def test_a_node_owing_many_young_replies_is_busy_not_stalled(cluster3):
    # A node that owes many replies, all asked just now, is behind (busy), not stalled: it
    # still gets commands. Only once its oldest owed reply is older than the stall age is
    # it skipped. The node is paused so that nothing is answered while the test looks.
    clock = FakeClock()
    connections = ConnectionSet(
        LockManager([cluster3[0].url]).addresses,
        clock=clock,
        max_outstanding=4,
        stall_reset=10.0,
        stall_age=0.05,
    )
    connections.run([PING], 5, b"PONG", 1)  # connected, nothing owed
    with cluster3[0].paused_while():
        for _ in range(8):  # twice the count that used to mark it stalled
            exchange = connections.send_round([PING])
            assert not isinstance(exchange.results[0], NotSent), exchange.results
        clock.advance(0.1)  # the oldest owed reply is now older than the stall age
        exchange = connections.send_round([PING])
        assert isinstance(exchange.results[0], NotSent)
        assert "stalled" in str(exchange.results[0])
    connections.close()


# -- cancelled while reconnecting -----------------------------------------------------------


def test_a_task_cancelled_while_reconnecting_leaves_the_node_usable(cluster3):
    async def main() -> None:
        manager = AsyncLockManager(cluster3.urls, node_timeout=1.0)
        await (await manager.acquire("warm", ttl=5.0)).release()
        cluster3[0].restart(fresh=True)  # our connection to node 0 is closed by the server
        await asyncio.sleep(0.05)  # the loop hears of it
        task = asyncio.create_task(manager.acquire("cut", ttl=5.0, blocking=False))
        await step_until(
            lambda: any("_connect" in chain(t) for t in asyncio.all_tasks()),
            "node 0 being reconnected",
        )
        await cancelled(task)
        lease = await manager.acquire("next", ttl=5.0, blocking=False)
        with node_client(cluster3[0]) as client:
            deadline = time.monotonic() + 5
            while not client.exists(lease.key):  # node 0 votes again
                assert time.monotonic() < deadline, "node 0 never took the key"
                await asyncio.sleep(0.01)
        await lease.release()
        await manager.aclose()

    asyncio.run(main())


# -- a release right after a node restart -----------------------------------------------------


def test_a_release_right_after_a_node_restart_deletes_the_key_there(tmp_path):
    # Node 0 restarts from its AOF holding the key. Its last reply and the close of our old
    # connection often come in one read; the close used to go unseen, so the release was
    # written to the dead connection ("broken pipe") and the key stayed for its whole ttl.
    # It failed about one try in six: twenty tries.
    with LocalCluster(3, tmp_path, fresh=False, extra_args=DURABLE_ARGS) as cluster:
        manager = LockManager(cluster.urls)
        for attempt in range(20):
            lease = manager.acquire(f"restart-{attempt}", ttl=LONG_TTL, timeout=5.0)
            cluster[0].restart()
            lease.release()
            with node_client(cluster[0]) as client:
                deadline = time.monotonic() + 5
                while client.exists(lease.key):
                    assert time.monotonic() < deadline, f"key left on node 0 ({attempt})"
                    time.sleep(0.01)
        manager.close()


# -- a hello still out when the round ends ------------------------------------------------


def test_a_quorum_reached_before_a_nodes_hello_still_sends_that_node_its_set(cluster3):
    # A new connection holds identified commands until its hello is answered. The acquire
    # returns at a quorum of the two other nodes; the paused node's SET must still go out
    # (unidentified: the round is over), not wait for this thread's next operation, which
    # may never come, leaving the lease on 2 of 3 nodes, one failure from lost.
    manager = LockManager(cluster3.urls, node_timeout=0.05)
    with cluster3[2].paused_while():
        lease = manager.acquire("late-hello", ttl=LONG_TTL)
    # The manager is not used again: only what it already sent can reach the node.
    deadline = time.monotonic() + 5.0
    with node_client(cluster3[2]) as client:
        while lock_token(client, lease.key) != lease.token.encode():
            assert time.monotonic() < deadline, "the paused node never got the lease's SET"
            time.sleep(0.005)
    lease.release()
