"""Input at the edges: arguments of a re-entry checked like a first acquire's."""

from __future__ import annotations

import math

import pytest

from django_redlock import LockManager

# -- point: a re-entry checks its arguments ------------------------------------------------


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"ttl": -1}, ValueError, "ttl must be more than zero"),
        ({"ttl": math.nan}, ValueError, "ttl must be a finite"),
        ({"ttl": "30"}, TypeError, "ttl must be a number"),
        ({"ttl": 86400.5}, ValueError, "ttl="),
        ({"timeout": -1}, ValueError, "timeout must be zero or more"),
        ({"blocking": "yes"}, TypeError, "blocking must be a bool"),
        ({"blocking": False, "timeout": 2.0}, ValueError, "blocking=False"),
        ({"max_hold": 5.0}, ValueError, "max_hold only applies"),
        ({"origin": 3}, TypeError, "origin must be a str"),
    ],
)
def test_a_reentrant_acquire_checks_its_arguments_like_a_first(cluster3, options, error, match):
    manager = LockManager(cluster3.urls)
    lease = manager.acquire("reentry", ttl=10.0)
    with pytest.raises(error, match=match):
        manager.acquire("reentry", **options)
    assert lease.depth == 1  # the refused re-entry was not counted
    lease.release()
    assert lease.released
