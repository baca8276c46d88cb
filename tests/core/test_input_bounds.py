"""Input at the edges: arguments of a re-entry checked like a first acquire's, real numbers of
every type for seconds, and the owner record stored with every lock kept small."""

from __future__ import annotations

import asyncio
import json
import math
import threading
from decimal import Decimal
from fractions import Fraction
from typing import Any

import pytest

from django_redlock import AsyncLockManager, LockManager
from django_redlock.redlock import MAX_ORIGIN_BYTES, MAX_OWNER_BYTES
from tests.helpers import node_client
from tests.helpers import stored_owner as stored_record

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


# -- point: the owner record is bounded ------------------------------------------------------


def stored_owner(cluster, name: str) -> bytes:
    with node_client(cluster[0]) as client:
        owner = stored_record(client, f"redlock:{name}")
    assert isinstance(owner, bytes)
    return owner


@pytest.mark.parametrize(
    "origin",
    [
        "x" * 1_000_000,  # 1 MB, once stored on every node for every lock
        "é" * 5000,  # cut on a character boundary, never inside one
        "🔒" * 5000,  # four bytes each, escaped as two \\u escapes in the JSON
        "\x01" * 1000,  # under the origin's cap, but six bytes each once escaped
    ],
)
def test_a_huge_origin_is_cut_and_the_owner_record_is_capped(cluster3, origin):
    manager = LockManager(cluster3.urls)
    lease = manager.acquire("owner", ttl=10.0, origin=origin)
    assert lease.origin is not None
    assert len(lease.origin.encode("utf-8")) <= MAX_ORIGIN_BYTES
    assert lease.origin == origin or (
        lease.origin.endswith("…") and origin.startswith(lease.origin[:-1])
    )
    raw = stored_owner(cluster3, "owner")
    assert len(raw) <= MAX_OWNER_BYTES
    stored = json.loads(raw)
    assert origin.startswith(stored["origin"].rstrip("…"))
    holder = manager.holder("owner")
    assert holder is not None
    assert holder["origin"] == stored["origin"]
    lease.release()


def test_a_short_origin_is_kept_whole(cluster3):
    manager = LockManager(cluster3.urls)
    origin = "x" * MAX_ORIGIN_BYTES
    lease = manager.acquire("owner-short", ttl=10.0, origin=origin)
    assert lease.origin == origin
    assert json.loads(stored_owner(cluster3, "owner-short"))["origin"] == origin
    lease.release()


def test_huge_thread_and_task_names_are_capped_too(cluster3):
    manager = LockManager(cluster3.urls)
    sizes: list[int] = []

    def in_thread() -> None:
        async def in_task() -> None:
            lease = manager.acquire("owner-names", ttl=10.0, origin="o" * 5000)
            sizes.append(len(stored_owner(cluster3, "owner-names")))
            lease.release()

        async def main() -> None:
            await asyncio.create_task(in_task(), name="t" * 100_000)

        asyncio.run(main())

    worker = threading.Thread(target=in_thread, name="n" * 100_000)
    worker.start()
    worker.join()
    assert sizes
    assert sizes[0] <= MAX_OWNER_BYTES
