"""Node faults with real processes: paused (SIGSTOP), killed, restarted.

The bounds asserted here are "never hangs" bounds with a wide margin for a loaded CI machine
(redis-py's default retries would turn each of these into a multi-second stall), not speed.
"""

from __future__ import annotations

import time

import pytest

from django_redlock import LockContended, LockManager, QuorumUnreachable
from tests.helpers import lock_token, node_client

NODE_TIMEOUT = 0.05
# Scheduling noise on a 2-core machine running 8 servers; far below any retry-induced hang.
MARGIN = 0.5


def timed(call):
    start = time.monotonic()
    try:
        result = call()
    except Exception as exc:
        return exc, time.monotonic() - start
    return result, time.monotonic() - start


@pytest.mark.parametrize(("size", "paused"), [(3, 1), (5, 2)])
def test_acquire_succeeds_with_a_minority_paused(request, size, paused):
    cluster = request.getfixturevalue(f"cluster{size}")
    manager = LockManager(cluster.urls, node_timeout=NODE_TIMEOUT)
    for node in cluster.nodes[:paused]:
        node.pause()
    for attempt in range(20):  # many times: stalled connections must not pile up
        lease, took = timed(lambda attempt=attempt: manager.acquire(f"m{attempt}", ttl=5.0))
        assert not isinstance(lease, Exception), lease
        assert took < NODE_TIMEOUT + MARGIN
        lease.release()
    assert manager.open_connections() <= size


@pytest.mark.parametrize("fault", ["pause", "kill"])
@pytest.mark.parametrize(("size", "down"), [(3, 2), (5, 3)])
def test_a_majority_down_fails_fast_with_quorum_unreachable(request, size, down, fault):
    cluster = request.getfixturevalue(f"cluster{size}")
    manager = LockManager(cluster.urls, node_timeout=NODE_TIMEOUT, retry_delay=0.05)
    for node in cluster.nodes[:down]:
        getattr(node, fault)()
    error, took = timed(lambda: manager.acquire("down", blocking=False))
    assert isinstance(error, QuorumUnreachable)
    assert took < NODE_TIMEOUT + MARGIN
    assert len(error.node_errors) == down
    for label in error.node_errors:
        assert label in manager.nodes
    # A blocking acquire is bounded by its timeout plus one node timeout.
    error, took = timed(lambda: manager.acquire("down", timeout=0.3))
    assert isinstance(error, QuorumUnreachable)
    if fault == "kill":
        # Killed nodes refuse connections outright: no quorum is possible, so it gives up
        # after a second round one node timeout later, not at its timeout (issue 40).
        assert error.attempts == 2
        assert "the nodes refuse connections" in str(error)
    else:
        # Paused nodes time out: they may be alive, so it tries until its timeout.
        assert error.attempts > 1
        assert 0.3 <= took < 0.3 + NODE_TIMEOUT + MARGIN


def test_contention_with_a_node_down_is_contended_not_unreachable(cluster3):
    holder = LockManager(cluster3.urls, node_timeout=NODE_TIMEOUT)
    lease = holder.acquire("c", ttl=10.0)
    lease.extend()  # make sure all three nodes hold it
    cluster3[2].kill()
    with pytest.raises(LockContended) as info:
        LockManager(cluster3.urls, node_timeout=NODE_TIMEOUT).acquire("c", blocking=False)
    assert list(info.value.node_errors) == [cluster3[2].url + "?db=0"]
    lease.release()


def test_a_killed_and_restarted_node_is_used_again(cluster3):
    manager = LockManager(cluster3.urls, node_timeout=NODE_TIMEOUT)
    manager.acquire("before", ttl=5.0).release()
    cluster3[1].kill()
    manager.acquire("during", ttl=5.0).release()  # 2 of 3 still form a quorum
    cluster3[1].start()
    # The broken connection is replaced: with another node down, node 1 must vote again.
    cluster3[0].kill()
    lease = manager.acquire("after", ttl=5.0)
    lease.release()


def test_a_request_queued_on_a_paused_node_is_undone_when_it_wakes(cluster3):
    manager = LockManager(cluster3.urls, node_timeout=NODE_TIMEOUT)
    other = LockManager(cluster3.urls, node_timeout=NODE_TIMEOUT)
    node = cluster3[2]
    node.pause()
    lease = manager.acquire("zombie", ttl=30.0)
    lease.release()
    blocker = other.acquire("zombie", ttl=30.0)  # nodes 0 and 1
    node.resume()
    # The paused node applied the queued SET, then the release queued behind it on the same
    # connection: no zombie key of the first lease is left with its 30 s ttl.
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        with node_client(node) as client:
            if lock_token(client, lease.key) != lease.token.encode():
                break
    with node_client(node) as client:
        assert lock_token(client, lease.key) != lease.token.encode()
    blocker.release()


def test_a_node_paused_then_resumed_recovers_its_vote(cluster3):
    manager = LockManager(cluster3.urls, node_timeout=NODE_TIMEOUT)
    with cluster3[0].paused_while():
        for attempt in range(40):  # more than the outstanding-reply cap
            manager.acquire(f"p{attempt}", ttl=5.0).release()
    cluster3[1].kill()
    # Node 0 is awake again and node 1 is gone: node 0's vote is needed for a quorum.
    deadline = time.monotonic() + 5
    while True:
        try:
            manager.acquire("recovered", ttl=5.0).release()
            break
        except QuorumUnreachable:
            assert time.monotonic() < deadline, "node 0 never voted again"


def test_unreachable_addresses_fail_fast(tmp_path):
    manager = LockManager(
        [f"unix://{tmp_path}/none{i}.sock" for i in range(3)], node_timeout=NODE_TIMEOUT
    )
    error, took = timed(lambda: manager.acquire("x", blocking=False))
    assert isinstance(error, QuorumUnreachable)
    assert "no such file" in str(error)
    assert took < NODE_TIMEOUT + MARGIN
