"""A client whose max_ttl is shorter than another's learns the longer quarantine from the
nodes (scripts/quarantine_longer.lua), so it never brings the shorter one to a node that
restarts empty (found by the simulator: tests/sim, profile 'quarantines')."""

from __future__ import annotations

import logging

import pytest

from django_redlock import LockManager, QuorumUnreachable


def test_a_shorter_quarantine_is_refused_once_then_learned(cluster3, caplog):
    short = LockManager(cluster3.urls, max_ttl=60.0)
    short.acquire("learn:warm-up", blocking=False).release()  # connected: its hello is past
    assert short.quarantine_ms == 60_000
    # Another process with a longer max_ttl takes a lease: the nodes remember its quarantine.
    long = LockManager(cluster3.urls, max_ttl=600.0)
    long.acquire("learn:other", ttl=500.0, blocking=False).release()
    caplog.set_level(logging.WARNING, logger="django_redlock")
    with pytest.raises(QuorumUnreachable) as refused:
        short.acquire("learn:mine", blocking=False)
    assert "QUARANTINE_LONGER 600000 ms" in str(refused.value)
    assert short.quarantine_ms == 600_000
    assert "the same MAX_TTL" in caplog.text
    # From now on it sends the longer one, and the nodes vote.
    short.acquire("learn:mine", blocking=False).release()
    short.close()
    long.close()
