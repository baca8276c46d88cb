"""Replica acknowledgement on real processes (issue 39, item 2: the node setting REPLICA_ACKS).

A master and its replica started as an operator starts them (tests/core/test_failover.py's
Pair); the promotion is Sentinel's REPLICAOF NO ONE. With REPLICA_ACKS, a grant counts only
once WAIT confirmed the replica has it, so the promoted replica holds every lease that counted
and votes at once; without it, the quarantine still applies. The suite runs on the bundled
Valkey and again on Redis 7.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from django_redlock import AsyncLockManager, LockContended, LockManager, LockNotAcquired
from django_redlock.localnodes import LocalNode
from tests.core import test_failover
from tests.core.test_failover import (
    MAX_TTL,
    NODE_TIMEOUT,
    promote,
    synced,
    wait_for,
)
from tests.helpers import lock_token, node_client


@pytest.fixture
def extra_replica():
    """Starts replicas of a given master (stopped after the test)."""
    started: list[LocalNode] = []
    directory = Path(tempfile.mkdtemp(prefix="rl-ack-", dir="/tmp"))

    def start(master: LocalNode) -> LocalNode:
        node = LocalNode(
            directory,
            name=f"x{len(started)}",
            tcp=True,
            extra_args=("--replicaof", "127.0.0.1", str(master.port)),
        )
        node.start(fresh=False)
        started.append(node)
        wait_for(lambda: synced(node), "the new replica's first sync")
        return node

    yield start
    for node in started:
        node.stop()
    shutil.rmtree(directory, ignore_errors=True)


def token_on(node, key: str) -> str | None:
    with node_client(node) as client:
        token = lock_token(client, key)
    return None if token is None else token.decode()


pytestmark = pytest.mark.slow

make_pair = test_failover.make_pair  # the fixture: master/replica pairs


def acked(*nodes, acks: int = 1, **options) -> LockManager:
    return LockManager(
        [f"{node.url}?replica_acks={acks}" for node in nodes],
        ttl=MAX_TTL * 5,
        max_ttl=MAX_TTL * 5,
        node_timeout=NODE_TIMEOUT,
        retry_delay=0.05,
        **options,
    )


def plain(*nodes) -> LockManager:
    return LockManager(
        [node.url for node in nodes],
        ttl=MAX_TTL * 5,
        max_ttl=MAX_TTL * 5,
        node_timeout=NODE_TIMEOUT,
        retry_delay=0.05,
    )


def fail_over(pair) -> None:
    """Kill the master and promote its replica (nothing paused: the replica has what it
    acknowledged)."""
    pair.master.kill()
    promote(pair.replica)


def test_an_acknowledged_lock_is_on_the_promoted_replica_which_votes_at_once(
    make_pair, extra_replica
):
    pair = make_pair("k")
    first = acked(pair.master).acquire("acct:1", blocking=False)
    fail_over(pair)
    # The first lease's key is on the promoted node: nobody else can take it there.
    assert token_on(pair.replica, "redlock:acct:1") == first.token
    # A new replica for the promoted master (REPLICA_ACKS 1 counts nothing without one).
    extra_replica(pair.replica)
    manager = acked(pair.replica)
    with pytest.raises(LockContended) as refused:  # held there, not quarantined
        manager.acquire("acct:1", blocking=False)
    assert "QUARANTINED" not in repr(refused.value.node_errors)
    # ...and it votes at once for another name, well inside the quarantine (MAX_TTL * 5).
    other = manager.acquire("acct:2", blocking=False)
    assert other.validity > 0
    assert first.validity > 0  # the first lease still runs: no overlap on acct:1


def test_without_acks_a_promoted_replica_still_sits_out_the_quarantine(make_pair):
    pair = make_pair("n")
    plain(pair.master).acquire("acct:1", blocking=False)
    fail_over(pair)
    with pytest.raises(LockNotAcquired) as refused:
        plain(pair.replica).acquire("acct:2", blocking=False)
    assert "QUARANTINED a replica promoted" in repr(refused.value.node_errors)


def test_a_client_without_acks_is_refused_where_grants_are_acknowledged(make_pair):
    pair = make_pair("c")
    acked(pair.master).acquire("acct:1", blocking=False).release()
    with pytest.raises(LockNotAcquired) as refused:
        plain(pair.master).acquire("acct:2", blocking=False)
    assert "REPLICA_ACKS" in repr(refused.value.node_errors)


def test_grants_that_no_wait_follows_are_refused_where_grants_are_acknowledged(make_pair):
    """A semaphore, a read-write lock, a multi-lock and a lease hand-off are never followed by
    WAIT: on a node that carries the claim (which a promoted replica trusts to vote at once)
    each is refused, whatever the client's settings, and writes nothing."""
    pair = make_pair("g")
    acked(pair.master).acquire("acct:1", blocking=False).release()
    before = {}
    with node_client(pair.master) as client:
        before = {key: client.dump(key) for key in client.keys("redlock:*")}
    for manager in (plain(pair.master), acked(pair.master)):
        attempts = (
            lambda m=manager: m.semaphore("sem", 2).acquire(blocking=False),
            lambda m=manager: m.rwlock("rw").write(blocking=False),
            lambda m=manager: m.lock_many(["m:1", "m:2"], blocking=False),
        )
        for attempt in attempts:
            with pytest.raises(LockNotAcquired) as refused:
                attempt()
            assert "REPLICA_ACKS" in repr(refused.value.node_errors)
    with node_client(pair.master) as client:
        assert {key: client.dump(key) for key in client.keys("redlock:*")} == before


def test_a_paused_replica_fails_the_acquire_within_the_node_timeout_and_frees_the_key(make_pair):
    pair = make_pair("p")
    acked(pair.master).acquire("warm", blocking=False).release()
    pair.replica.pause()
    try:
        manager = acked(pair.master)
        start = time.monotonic()
        with pytest.raises(LockNotAcquired) as refused:
            manager.acquire("acct:1", blocking=False)
        # A hang guard, not a speed claim: WAIT gives up inside the node timeout.
        assert time.monotonic() - start < 10 * NODE_TIMEOUT
        assert "REPLICA_ACKS" in repr(refused.value.node_errors) or "timed out" in repr(
            refused.value.node_errors
        )
        # The attempt's clean-up freed the key it took (it runs behind the WAIT).
        wait_for(lambda: token_on(pair.master, "redlock:acct:1") is None, "the clean-up")
    finally:
        pair.replica.resume()


def test_a_replica_that_came_is_counted_at_once(make_pair, extra_replica):
    """Redisson #6518: a count read once never sees a replica that came (back); here the
    script reads it at every grant, refuses a client that waits for fewer, and the client
    retries with the count it was told."""
    pair = make_pair("b")
    manager = acked(pair.master)
    manager.acquire("warm", blocking=False).release()
    extra_replica(pair.master)
    wait_for(lambda: _online(pair.master) == 2, "both replicas online")
    with pytest.raises(LockNotAcquired) as refused:  # this try waited for one replica
        manager.acquire("acct:0", blocking=False)
    assert "REPLICA_ACKS need 2" in repr(refused.value.node_errors)
    lease = manager.acquire("acct:1", blocking=False)  # the next waits for both
    assert lease.validity > 0


def _online(node) -> int:
    with node_client(node) as client:
        return sum(
            1
            for key, value in client.info("replication").items()
            if key.startswith("slave") and isinstance(value, dict)
            if value.get("state") == "online"
        )


def test_wait_refused_says_why(make_pair):
    """Redisson #3474: a provider that refuses WAIT. Here an ACL user without it."""
    pair = make_pair("w")
    with node_client(pair.master) as client:
        client.execute_command("ACL", "SETUSER", "locks", "on", ">pw", "~*", "+@all", "-wait")
    url = pair.master.url.replace("redis://", "redis://locks:pw@") + "?replica_acks=1"
    manager = LockManager([url], ttl=10, max_ttl=10, node_timeout=NODE_TIMEOUT)
    with pytest.raises(LockNotAcquired) as refused:
        manager.acquire("acct:1", blocking=False)
    text = repr(refused.value.node_errors)
    assert "REPLICA_ACKS is set for this node, but WAIT failed" in text


def test_the_asyncio_manager_waits_for_acknowledgement_too(make_pair):
    pair = make_pair("a")

    async def main() -> str:
        manager = AsyncLockManager(
            [f"{pair.master.url}?replica_acks=1"], ttl=10, max_ttl=10, node_timeout=NODE_TIMEOUT
        )
        lease = await manager.acquire("acct:1", blocking=False)
        pair.replica.pause()
        try:
            with pytest.raises(LockNotAcquired) as refused:
                await manager.acquire("acct:2", blocking=False)
        finally:
            pair.replica.resume()
        await manager.aclose()
        return lease.token + " " + str(refused.value) + repr(refused.value.node_errors)

    token, errors = asyncio.run(main()).split(" ", 1)
    assert token_on(pair.replica, "redlock:acct:1") == token
    # The paused replica's WAIT ends at 4/5 of the node timeout; on a loaded machine the
    # node's two replies may come after the node timeout itself: a no vote all the same.
    assert "REPLICA_ACKS" in errors or "timed out" in errors or "no answer within" in errors
