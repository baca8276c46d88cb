"""Restart quarantine: a node that lost its data must not vote while a lease it forgot runs.

Without it (measured in the design notes): a second client got the lock 15 ms after such a
crash while the first holder was still valid.
"""

from __future__ import annotations

import time

import pytest

from django_redlock import LockManager, LockNotAcquired
from django_redlock.localnodes import LocalCluster

WAIT = 15.0


def test_a_node_restarted_empty_cannot_hand_out_a_lock_it_forgot(cluster3):
    _, n1, n2 = cluster3.nodes
    n2.kill()
    holder = LockManager(cluster3.urls, ttl=1.0, max_ttl=1.0)
    lease = holder.acquire("seat:1")  # A holds it on n0 and n1
    n2.start(fresh=True)  # n2 was empty all along: it may vote
    n1.restart()  # n1 crashes and comes back without A's key
    # B starts after the crash and has never seen these nodes before.
    rival = LockManager(cluster3.urls, ttl=1.0, max_ttl=1.0)
    with pytest.raises(LockNotAcquired) as info:
        rival.acquire("seat:1", blocking=False)  # n0: held by A; n1: quarantined; n2: yes
    assert info.value.votes <= 1  # n2 alone (the answer may be known before it replies)
    (error,) = [text for label, text in info.value.node_errors.items() if "n1.sock" in label]
    assert error.startswith("QUARANTINED")
    # Once every lease n1 may have granted has run out, n1 votes again.
    deadline = time.monotonic() + WAIT
    while True:
        try:
            rival.acquire("seat:1", blocking=False).release()
            break
        except LockNotAcquired:
            assert time.monotonic() < deadline, "n1 never left quarantine"
            time.sleep(0.05)
    assert lease.lost  # A's lease was over by then


def test_a_fresh_cluster_from_the_launcher_votes_at_once():
    with LocalCluster(3) as cluster:
        # max_ttl 60 s: a quarantine would last a minute. A generous node timeout: a node that
        # just restarted compiles its scripts first, and the machine may be busy.
        manager = LockManager(cluster.urls, node_timeout=0.5, retry_delay=0.05)
        manager.acquire("first", ttl=5.0).release()
        cluster[0].restart()
        cluster[1].kill()
        with pytest.raises(LockNotAcquired) as info:
            manager.acquire("second", ttl=5.0, timeout=0.5)
        assert any(text.startswith("QUARANTINED") for text in info.value.node_errors.values())
        cluster[1].start()  # fresh by default
        cluster[0].declare_fresh()
        manager.acquire("third", ttl=5.0).release()


def test_declare_fresh_through_the_manager(cluster3):
    cluster3[0].restart()
    cluster3[1].restart()
    manager = LockManager(cluster3.urls)
    with pytest.raises(LockNotAcquired):
        manager.acquire("x", blocking=False)
    manager.declare_fresh()
    manager.acquire("x", blocking=False).release()


def test_a_ttl_above_max_ttl_is_refused(cluster3):
    manager = LockManager(cluster3.urls, ttl=10.0)
    assert manager.max_ttl == 60.0
    with pytest.raises(ValueError, match="above max_ttl=60"):
        manager.acquire("long", ttl=120.0)
    with pytest.raises(ValueError, match="above max_ttl"):
        LockManager(cluster3.urls, ttl=30.0, max_ttl=10.0)
