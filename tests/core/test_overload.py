"""Blocked waiters must not drown the nodes in retries: a waiter is woken by pub/sub when its
turn comes, so its poll (the safety net for a lost wake-up) backs off while it waits, without
ever letting its place in line lapse. The load itself is measured by benchmark W5
(``python -m benchmarks --only w5``); these tests pin the behaviour behind it."""

from __future__ import annotations

import threading
import time

import pytest

from django_redlock import LockContended, LockManager
from tests.helpers import queued_on_a_majority

SHORT_POLL = 0.01


def test_a_blocked_waiter_polls_less_and_less(cluster3):
    holder = LockManager(cluster3.urls)
    lease = holder.acquire("busy", ttl=30.0)
    waiter = LockManager(cluster3.urls, retry_delay=SHORT_POLL)
    with pytest.raises(LockContended) as gave_up:
        waiter.acquire("busy", ttl=5.0, timeout=2.0)
    # At a fixed 10 ms poll (5-15 ms with jitter) two seconds are well over 100 tries. Backing
    # off (at least 5, 10, 20, 40, 80 ms, then at least 100 ms each: a fifth of the 1 s life of
    # a place in line, less the jitter) they are at most about 25; a slower machine makes fewer.
    assert gave_up.value.attempts <= 30
    lease.release()


def test_a_waiter_that_backed_off_keeps_its_place_and_is_woken_at_once(cluster3):
    # The first waiter backs off to its longest poll; a second one queues behind it much
    # later. If the first one's place had lapsed, the second would be ahead of it.
    holder = LockManager(cluster3.urls)
    lease = holder.acquire("queue", ttl=30.0)
    order: list[str] = []
    first = LockManager(cluster3.urls, retry_delay=SHORT_POLL)
    second = LockManager(cluster3.urls, retry_delay=SHORT_POLL)

    def wait(manager: LockManager, label: str) -> None:
        lease = manager.acquire("queue", ttl=5.0, timeout=30.0)
        order.append(label)  # while holding it: after the release the next may log first
        lease.release()

    early = threading.Thread(target=wait, args=(first, "first"))
    early.start()
    deadline = time.monotonic() + 10.0
    while not queued_on_a_majority(cluster3, "queue", 1):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    time.sleep(2.5)  # more than twice the 1 s life of a place: only its polls keep it
    late = threading.Thread(target=wait, args=(second, "second"))
    late.start()
    while not queued_on_a_majority(cluster3, "queue", 2):
        assert time.monotonic() < deadline + 5.0
        time.sleep(0.01)
    lease.release()
    early.join(10.0)
    late.join(10.0)
    assert order == ["first", "second"]
