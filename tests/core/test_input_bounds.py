"""Input at the edges: arguments of a re-entry checked like a first acquire's, and real
numbers of every type for seconds."""

from __future__ import annotations

import asyncio
import math
from decimal import Decimal
from fractions import Fraction
from typing import Any

import pytest

from django_redlock import AsyncLockManager, LockManager

# Nothing listens here: the argument checks must fail before a connection is tried.
NODES = ["redis://127.0.0.1:1/0", "redis://127.0.0.1:2/0", "redis://127.0.0.1:3/0"]

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


# -- point: real numbers that are not float or int -------------------------------------------


@pytest.mark.parametrize("seconds", [Decimal("2.5"), Fraction(5, 2), 2.5, 2])
def test_ttl_timeout_and_max_hold_take_any_real_number(cluster3, seconds):
    manager = LockManager(cluster3.urls, ttl=seconds, retry_delay=seconds / 50)
    assert manager.ttl == float(seconds)
    assert type(manager.ttl) is float
    lease = manager.acquire(
        "real", ttl=seconds, timeout=seconds, auto_extend=True, max_hold=seconds
    )
    assert type(lease.ttl) is float
    assert lease.ttl == float(seconds)
    assert 0 < lease.validity <= float(seconds)
    lease.release()


def test_the_asyncio_manager_takes_the_same_numbers(cluster3):
    async def main() -> float:
        manager = AsyncLockManager(cluster3.urls)
        # The annotations say float (as int passes for float); any real number is accepted.
        options: dict[str, Any] = {"ttl": Decimal("2.5"), "timeout": Fraction(1, 2)}
        lease = await manager.acquire("real-async", **options)
        ttl = lease.ttl
        await lease.release()
        await manager.aclose()
        return ttl

    assert asyncio.run(main()) == 2.5


@pytest.mark.parametrize(
    ("value", "error", "match"),
    [
        (Decimal("NaN"), ValueError, "finite"),
        (Decimal("sNaN"), ValueError, "finite"),
        (Decimal("Infinity"), ValueError, "finite"),
        (Decimal("1e400"), ValueError, "finite"),
        (10**400, ValueError, "finite"),
        (Decimal("-1"), ValueError, "zero"),
        (Fraction(-1, 2), ValueError, "zero"),
        (True, TypeError, "not bool"),
        (1 + 0j, TypeError, "not complex"),
        ("1", TypeError, "not str"),
    ],
)
@pytest.mark.parametrize("argument", ["ttl", "timeout", "max_hold"])
def test_bad_numbers_name_their_argument(value, error, match, argument):
    manager = LockManager(NODES)
    options = {argument: value}
    if argument == "max_hold":
        options["auto_extend"] = True
    with pytest.raises(error, match=f"^{argument}.*{match}"):
        manager.acquire("name", **options)
