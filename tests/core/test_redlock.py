"""LockManager and Lease semantics on real nodes: quorum, release, extend, validity."""

from __future__ import annotations

import time

import pytest

from django_redlock import (
    LeaseReleased,
    LockContended,
    LockLost,
    LockManager,
    QuorumUnreachable,
    RedlockError,
)
from tests.helpers import FakeClock, lock_token, node_client, put_lock, stored_owner


def make(cluster, **options) -> LockManager:
    options.setdefault("retry_delay", 0.01)
    return LockManager(cluster.urls, **options)


def holders(cluster, key: str) -> list[bytes | None]:
    """The token each node holds for ``key`` (None where absent)."""
    tokens = []
    for node in cluster:
        with node_client(node) as client:
            tokens.append(lock_token(client, key))
    return tokens


def test_acquire_sets_the_key_on_every_node_and_release_deletes_it(cluster5):
    manager = make(cluster5)
    lease = manager.acquire("orders:42", ttl=10.0)
    assert lease.name == "orders:42"
    assert lease.key == "redlock:orders:42"
    assert manager.quorum == 3
    # acquire returns at quorum; the other nodes still apply the SET, so wait for them.
    lease.extend()
    assert holders(cluster5, lease.key).count(lease.token.encode()) >= 3
    lease.release()
    assert holders(cluster5, lease.key) == [None] * 5
    assert lease.released
    assert not lease.lost


def test_the_context_manager_acquires_and_releases(cluster3):
    manager = make(cluster3)
    with manager.lock("job", ttl=5.0, timeout=1.0) as lease:
        assert not lease.lost
        key = lease.key
    assert lease.released
    assert holders(cluster3, key) == [None] * 3


def test_a_held_lock_is_contended_for_a_second_client(cluster3):
    first, second = make(cluster3), make(cluster3)
    lease = first.acquire("report", ttl=10.0)
    with pytest.raises(LockContended) as info:
        second.acquire("report", blocking=False)
    error = info.value
    # The first acquire returns at a quorum: its SET may reach the third node after the
    # second client's, which that node then grants (and the failed attempt releases).
    assert error.votes <= 1
    assert error.quorum == 2
    assert error.node_errors == {}
    assert error.retry_after is not None
    assert 0 < error.retry_after <= 10.0
    assert isinstance(error, RedlockError)
    lease.release()
    second.acquire("report", blocking=False).release()


def test_blocking_acquire_retries_with_jitter_until_timeout(cluster3, clock: FakeClock):
    holder = make(cluster3)
    lease = holder.acquire("busy", ttl=30.0)
    waiter = LockManager(cluster3.urls, retry_delay=0.2, clock=clock, sleep=clock.sleep)
    with pytest.raises(LockContended) as info:
        waiter.acquire("busy", timeout=2.0)
    assert info.value.attempts == len(clock.sleeps) + 1 > 5
    assert all(0.0 < delay <= 0.3 for delay in clock.sleeps)
    assert len(set(clock.sleeps)) > 1, "retry delays must be jittered"
    assert sum(clock.sleeps) == pytest.approx(2.0)
    lease.release()


def test_blocking_acquire_gets_the_lock_once_it_is_released(cluster3, clock: FakeClock):
    holder = make(cluster3)
    lease = holder.acquire("handoff", ttl=30.0)

    def sleep(seconds: float) -> None:
        clock.sleep(seconds)
        if len(clock.sleeps) == 3 and not lease.released:
            lease.release()

    waiter = LockManager(cluster3.urls, clock=clock, sleep=sleep)
    second = waiter.acquire("handoff", timeout=10.0)
    assert len(clock.sleeps) == 3
    second.release()


def test_release_never_deletes_another_holders_key(cluster3):
    manager = make(cluster3)
    lease = manager.acquire("shared", ttl=10.0)
    # Another holder took over on every node (as after an expiry): release must not touch it.
    for node in cluster3:
        with node_client(node) as client:
            put_lock(client, lease.key, "someone-else")
    with pytest.raises(LockLost, match="only 0 of 3 nodes still held it"):
        lease.release()
    assert holders(cluster3, lease.key) == [b"someone-else"] * 3


def test_releasing_twice_is_reported(cluster3):
    lease = make(cluster3).acquire("twice", ttl=5.0)
    lease.release()
    with pytest.raises(LeaseReleased, match="already released"):
        lease.release()
    with pytest.raises(LeaseReleased):
        lease.extend()
    with pytest.raises(LeaseReleased):
        lease.check()


def test_release_after_expiry_is_reported_as_lost(cluster3, clock: FakeClock):
    manager = LockManager(cluster3.urls, clock=clock, sleep=clock.sleep)
    lease = manager.acquire("late", ttl=5.0)
    clock.advance(6.0)  # the local clock says the lease is over; the keys may linger
    assert lease.lost
    assert lease.validity == 0.0
    with pytest.raises(LockLost, match="expired before it was released"):
        lease.release()
    # The release still deleted our own keys, so nothing is left behind.
    assert holders(cluster3, lease.key) == [None] * 3


def test_validity_shrinks_by_elapsed_time_and_drift(cluster3, clock: FakeClock):
    manager = LockManager(cluster3.urls, drift_factor=0.01, clock=clock, sleep=clock.sleep)
    clock.step_per_call = 0.25  # the acquire reads the clock before and after: 0.25 s elapse
    lease = manager.acquire("validity", ttl=10.0)
    clock.step_per_call = 0.0
    # Valid until start + ttl - (ttl * drift + 2 ms): 10 - 0.25 - 0.102 left right after.
    assert lease.validity == pytest.approx(10.0 - 0.25 - 0.102)
    clock.advance(3.0)
    assert lease.validity == pytest.approx(10.0 - 0.25 - 0.102 - 3.0)
    lease.check()
    clock.advance(lease.validity)
    with pytest.raises(LockLost, match="expired"):
        lease.check()


def test_an_acquire_slower_than_the_ttl_is_not_a_lease(cluster3, clock: FakeClock):
    manager = LockManager(cluster3.urls, clock=clock, sleep=clock.sleep, node_timeout=0.05)
    clock.step_per_call = 0.6  # as if the client paused for the whole lease mid-acquire
    with pytest.raises(QuorumUnreachable, match="nothing left of the lease") as info:
        manager.acquire("slow", ttl=0.6, blocking=False)
    clock.step_per_call = 0.0
    assert info.value.votes >= 2
    # ...and the keys it set were released again (the release is pipelined: poll briefly).
    deadline = time.monotonic() + 5
    while holders(cluster3, "redlock:slow") != [None] * 3:
        assert time.monotonic() < deadline


def test_extend_renews_the_full_ttl(cluster3, clock: FakeClock):
    manager = LockManager(cluster3.urls, clock=clock, sleep=clock.sleep)
    lease = manager.acquire("renew", ttl=10.0)
    clock.advance(8.0)
    validity = lease.extend()
    assert validity == pytest.approx(10.0 - 0.1 - 0.002)
    assert lease.validity == pytest.approx(validity)
    with node_client(cluster3[0]) as client:
        assert client.pttl(lease.key) > 9000
    lease.release()


def test_a_lease_gone_from_a_majority_is_lost_and_frees_the_keys_it_set_again(cluster3):
    """An extend that finds the keys gone from a majority (an operator's force release, or
    nodes that lost them) ends the lease, even while its validity runs; the keys the
    renewal set again on those nodes are freed (compare-and-delete). The key it still held
    stays until its ttl: the freed nodes are a quorum, so a rival is not kept waiting."""
    manager = make(cluster3)
    lease = manager.acquire("continuity", ttl=10.0)
    lease.extend()  # all nodes hold it now
    for node in cluster3.nodes[:2]:
        with node_client(node) as client:
            client.delete(lease.key)  # it expired on a majority
    with pytest.raises(LockLost, match="no longer held by a quorum") as lost:
        lease.extend()
    assert lost.value.cause == "gone"
    assert lease.lost
    with pytest.raises(LockLost):
        lease.check()
    deadline = time.monotonic() + 5  # the clean-up is sent without waiting for its replies
    while holders(cluster3, lease.key) != [None, None, lease.token.encode()]:
        assert time.monotonic() < deadline
    make(cluster3).acquire("continuity", ttl=10.0, blocking=False).release()


def test_a_lease_found_gone_keeps_the_keys_that_keep_a_rival_out(cluster5):
    """A lease granted by exactly a quorum (two nodes refused it: an earlier holder's key)
    loses one of its three keys to a restart. Its next renewal finds fewer than a quorum of
    the nodes that granted it still holding it: lost, "gone". Yet no rival can have taken it:
    the restarted node votes for no one (quarantine), and the lease's two other keys keep
    every rival from a quorum until its validity ends. Freeing those keys with the lost
    lease's clean-up let a rival in while the lease's validity still ran (issue 22's strict
    fault storm, tests/core/test_fault_storm.py)."""
    holder, rival = (make(cluster5, ttl=2.0, max_ttl=2.0) for _ in range(2))
    key = "redlock:kept"
    for node in cluster5.nodes[1:3]:
        with node_client(node) as client:
            put_lock(client, key, "earlier")
            client.pexpire(key, 300)
    lease = holder.acquire("kept", ttl=2.0, blocking=False)  # granted by nodes 0, 3 and 4
    cluster5[0].restart()  # loses its key, and is quarantined for max_ttl
    time.sleep(0.35)  # the earlier holder's keys have run out
    with pytest.raises(LockLost) as lost:
        lease.extend()
    assert lost.value.cause == "gone"
    deadline = time.monotonic() + 5  # the clean-up is sent without waiting for its replies
    token = lease.token.encode()
    while holders(cluster5, key) != [None, None, None, token, token]:
        assert time.monotonic() < deadline
    assert lease._expires_at > time.monotonic()  # the validity it was granted still runs
    with pytest.raises(RedlockError):
        rival.acquire("kept", ttl=1.0, blocking=False)


def test_extend_after_local_expiry_is_lost(cluster3, clock: FakeClock):
    manager = LockManager(cluster3.urls, clock=clock, sleep=clock.sleep)
    lease = manager.acquire("too-late", ttl=2.0)
    clock.advance(2.5)
    with pytest.raises(LockLost, match="expired"):
        lease.extend()


def test_leaving_the_block_with_an_error_keeps_that_error(cluster3, clock: FakeClock):
    manager = LockManager(cluster3.urls, clock=clock, sleep=clock.sleep)

    def fail_after_the_lease_expired():
        with manager.lock("boom", ttl=2.0):
            clock.advance(5.0)  # the lease expired too: the KeyError must still win
            raise KeyError("boom")

    with pytest.raises(KeyError):
        fail_after_the_lease_expired()


def test_leaving_the_block_after_the_lease_expired_raises_lock_lost(cluster3, clock):
    manager = LockManager(cluster3.urls, clock=clock, sleep=clock.sleep)
    with pytest.raises(LockLost), manager.lock("overrun", ttl=2.0):
        clock.advance(5.0)


def test_leases_do_not_share_tokens_and_the_token_is_never_shown(cluster3):
    manager = make(cluster3)
    first = manager.acquire("a", ttl=5.0)
    second = manager.acquire("b", ttl=5.0)
    assert first.token != second.token
    assert len(first.token) == 40
    assert first.token not in repr(first)
    assert first.token not in repr(manager)
    first.release()
    second.release()


def test_owner_metadata_is_stored_with_the_key(cluster3):
    import json
    import os

    manager = make(cluster3)
    lease = manager.acquire("owned", ttl=5.0, origin="tests.view")
    with node_client(cluster3[0]) as client:
        stored = stored_owner(client, lease.key)
    assert stored is not None
    owner = json.loads(stored)
    assert owner["pid"] == os.getpid()
    assert owner["origin"] == "tests.view"
    assert owner["thread"] == "MainThread"
    assert lease.token not in json.dumps(owner)
    lease.release()


def test_a_users_key_under_the_prefix_is_held_by_someone_and_never_overwritten(cluster3):
    for node in cluster3:
        with node_client(node) as client:
            client.set("redlock:plain", "user data")  # a string, but not a lock of ours
            client.hset("redlock:hash", "field", "x")  # another type
    manager = make(cluster3)
    for name in ("plain", "hash"):
        with pytest.raises(LockContended):
            manager.acquire(name, blocking=False)
    with node_client(cluster3[0]) as client:
        assert client.get("redlock:plain") == b"user data"
        assert client.hgetall("redlock:hash") == {b"field": b"x"}


def test_evalsha_falls_back_to_eval_after_script_flush(cluster3):
    manager = make(cluster3)
    manager.acquire("warm", ttl=5.0).release()
    for node in cluster3:
        with node_client(node) as client:
            client.script_flush()
    lease = manager.acquire("after-flush", ttl=5.0)
    lease.release()
