"""A quarantined quorum says so (issue 23, item 4): the error, the 503, Retry-After and the
log name the quarantine and the time left, and no acquire waits out a timeout that the
quarantine is known to outlast.

Brand-new plain nodes (no persistence, nothing declared), started as an operator starts them:
each refuses to vote for ``MAX_TTL`` (60 s) after its start.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from django.test import Client

from django_redlock import LockManager, QuorumUnreachable
from django_redlock.localnodes import LocalCluster


@pytest.fixture(scope="module")
def brand_new() -> Iterator[LocalCluster]:
    with LocalCluster(3, fresh=False) as cluster:
        yield cluster


def test_the_error_says_quarantined_for_how_long_and_what_to_do(brand_new):
    manager = LockManager(brand_new.urls)
    try:
        with pytest.raises(QuorumUnreachable) as raised:
            manager.acquire("q", timeout=10)  # the quarantine outlasts it: no wait at all
    finally:
        manager.close()
    error = raised.value
    assert error.attempts == 1
    assert error.quarantined is not None
    assert 30 < error.quarantined <= 60
    assert error.retry_after == error.quarantined
    text = str(error)
    assert "quarantined since they started" in text
    assert "a quorum votes again in" in text
    assert "manage.py redlock_declare_fresh" in text


def test_a_view_answers_503_with_the_quarantine_in_retry_after_and_the_log(
    brand_new, settings, caplog
):
    settings.REDLOCK = {"NODES": brand_new.urls}
    settings.DEBUG = False
    caplog.set_level(logging.WARNING, logger="django_redlock")
    response = Client().post("/pay/1/")
    assert response.status_code == 503
    assert 30 < int(response["Retry-After"]) <= 60
    body = response.content.decode()
    assert body == "Service Unavailable: the lock nodes are quarantined since they started.\n"
    assert any("quarantined since they started" in r.getMessage() for r in caplog.records)
    settings.DEBUG = True
    body = Client().post("/pay/1/").content.decode()
    assert "a quorum votes again in" in body
    assert "redlock_declare_fresh" in body
