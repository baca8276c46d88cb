"""What a new user meets without asking: a finite default wait, a release that notices a
replaced key, and a Retry-After read from the nodes."""

from __future__ import annotations

import pytest

from django_redlock import LockContended, LockLost, LockManager
from django_redlock.procedures.flow import failure
from tests.helpers import FakeClock, node_client


def test_acquire_waits_for_the_default_timeout_not_forever(cluster3, clock: FakeClock):
    holder = LockManager(cluster3.urls)
    lease = holder.acquire("busy", ttl=30.0)
    waiter = LockManager(
        cluster3.urls, default_timeout=2.0, retry_delay=0.2, clock=clock, sleep=clock.sleep
    )
    started = clock.now
    with pytest.raises(LockContended):
        waiter.acquire("busy")  # no timeout given
    assert 2.0 <= clock.now - started < 2.5
    # An explicit timeout still wins, and so does an explicit None (forever) in intent.
    with pytest.raises(LockContended):
        waiter.acquire("busy", timeout=0.5)
    assert LockManager(cluster3.urls).default_timeout == 10.0
    lease.release()


def test_default_timeout_is_checked(cluster3):
    with pytest.raises(ValueError, match="default_timeout"):
        LockManager(cluster3.urls, default_timeout=-1)
    with pytest.raises(TypeError, match="default_timeout"):
        LockManager(cluster3.urls, default_timeout="10")  # type: ignore[arg-type]
    assert LockManager(cluster3.urls, default_timeout=None).default_timeout is None


def test_a_release_that_finds_the_key_replaced_by_another_type_is_a_lost_lease(cluster3):
    manager = LockManager(cluster3.urls)
    lease = manager.acquire("replaced", ttl=30.0)
    for node in cluster3:
        with node_client(node) as client:
            client.set(lease.key, "someone else's value")
    with pytest.raises(LockLost, match="only 0 of 3 nodes still held it"):
        lease.release()
    for node in cluster3:
        with node_client(node) as client:
            assert client.get(lease.key) == b"someone else's value"  # never deleted


def test_retry_after_is_when_a_quorum_of_the_holders_keys_run_out(cluster3):
    manager = LockManager(cluster3.urls)
    # Held on all three nodes for 12, 5 and 4 s: a quorum (2) is free after 5 s, not 12.
    error = failure(manager.engine.nodes, "report", [12_000, 5_000, 4_000], 0, 0.001, 1)
    assert error.retry_after == 5.0
    # One node granted this attempt: one more must free up, the shortest.
    assert (
        failure(manager.engine.nodes, "report", [b"OK", 9_000, 3_000], 1, 0.001, 1).retry_after
        == 3.0
    )
    # A key without expiry on the node that would be needed: unknown.
    assert failure(manager.engine.nodes, "report", [-1, -1, 3_000], 0, 0.001, 1).retry_after is None


def test_retry_after_is_read_from_the_nodes(cluster3):
    holder = LockManager(cluster3.urls)
    lease = holder.acquire("report", ttl=30.0)
    for node in cluster3:
        with node_client(node) as client:
            client.pexpire(lease.key, 7_000)
    with pytest.raises(LockContended) as info:
        LockManager(cluster3.urls).acquire("report", blocking=False)
    assert info.value.retry_after is not None
    assert 6.0 < info.value.retry_after <= 7.0  # not the holder's 30 s ttl
    lease.release()
