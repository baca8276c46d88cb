"""The first single try of every lease kind on brand-new durable nodes is granted (issue 23).

Nodes started as an operator starts them (``appendonly yes`` + ``appendfsync always``, no
declaration, nothing written to them first) prove their durability to the first client that
connects. A plain lock's script is preloaded on every new connection, so its first try
carried the connection's identity; the other kinds' scripts were not, so their first try
went as the EVAL fallback of a NOSCRIPT without it, and every node refused it as "durability
not checked yet". A skip-if-busy job using a semaphore skipped on every first run after a
deploy. Each case gets its own brand-new nodes: a grant records the node as known.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator

import pytest

from django_redlock import AsyncLockManager, LockManager
from django_redlock.localnodes import DURABLE_ARGS, LocalCluster
from tests.helpers import node_client, wait_for

TAKE = {
    "lock": lambda m: m.acquire("first", timeout=0),
    "semaphore": lambda m: m.semaphore("first", 2).acquire(timeout=0),
    "read": lambda m: m.rwlock("first").read(timeout=0),
    "write": lambda m: m.rwlock("first").write(timeout=0),
    "many": lambda m: m.lock_many(["first:a", "first:b"], timeout=0),
}


@pytest.fixture
def brand_new() -> Iterator[LocalCluster]:
    with LocalCluster(3, fresh=False, extra_args=DURABLE_ARGS) as cluster:
        yield cluster


@pytest.mark.parametrize("kind", sorted(TAKE))
def test_the_first_single_try_is_granted_without_a_warning(brand_new, kind, caplog):
    caplog.set_level(logging.WARNING, logger="django_redlock")
    manager = LockManager(brand_new.urls, node_timeout=0.5)
    try:
        lease = TAKE[kind](manager)
        assert lease.kind == kind
        lease.release()
    finally:
        manager.close()
    assert [r.getMessage() for r in caplog.records] == []


@pytest.mark.parametrize("kind", sorted(TAKE))
def test_asyncio_the_first_single_try_is_granted_without_a_warning(brand_new, kind, caplog):
    caplog.set_level(logging.WARNING, logger="django_redlock")

    async def first() -> None:
        manager = AsyncLockManager(brand_new.urls, node_timeout=0.5)
        try:
            lease = await TAKE[kind](manager)
            assert lease.kind == kind
            await lease.release()
        finally:
            await manager.aclose()

    asyncio.run(first())
    assert [r.getMessage() for r in caplog.records] == []


def test_the_grant_log_line_says_quorum_not_a_node_count(cluster3, caplog):
    """An acquire returns at a quorum, so its INFO line must not read like a node failure
    ("acquired on 2/3 nodes" with all three healthy)."""
    caplog.set_level(logging.INFO, logger="django_redlock")
    manager = LockManager(cluster3.urls)
    try:
        manager.acquire("logged", blocking=False).release()
    finally:
        manager.close()
    (line,) = [r.getMessage() for r in caplog.records if "acquired" in r.getMessage()]
    assert line.startswith("acquired 'logged': quorum ")
    assert " of 3 nodes in " in line
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_a_new_managers_first_adopt_is_granted_without_a_warning(brand_new, caplog):
    """The adopter is a process of its own (a new manager) whose first contact with the
    brand-new durable nodes is the adopt, sync and asyncio."""
    caplog.set_level(logging.WARNING, logger="django_redlock")
    with LockManager(brand_new.urls, node_timeout=0.5) as giver:
        handle = giver.acquire("first-adopt", ttl=30.0, timeout=0).handle()
        with LockManager(brand_new.urls, node_timeout=0.5) as adopter:
            adopter.adopt(handle).release()
        text = giver.acquire("first-adopt-async", ttl=30.0, timeout=0).handle().dumps()

    async def adopt() -> None:
        adopter = AsyncLockManager(brand_new.urls, node_timeout=0.5)
        try:
            await (await adopter.adopt(text)).release()
        finally:
            await adopter.aclose()

    asyncio.run(adopt())
    assert [r.getMessage() for r in caplog.records] == []


def _names_held(node) -> int:
    """How many keys under the lock prefix ``node`` holds (not the marker, not owner records,
    not the gone marks a waiter's release leaves for a minute: scripts/hand_gone.lua)."""
    with node_client(node) as client:
        return sum(1 for key in client.scan_iter(match="redlock:*") if b"\x00x" not in key)


@pytest.mark.parametrize("kind", sorted(TAKE))
def test_the_first_release_of_every_kind_reaches_a_node_that_answers_late(cluster3, kind):
    """A release returns at a quorum. Before every kind's scripts were loaded on each new
    connection, the first release of a semaphore, a read-write lock or a multi-lock met
    NOSCRIPT on every node: its EVAL went to the node that answered late only once this
    thread read that reply, at its next operation. A process that then went idle left the
    lock held on that node for its whole ttl (seen in CI as a flaky listing test)."""
    manager = LockManager(cluster3.urls, node_timeout=0.5)
    try:
        lease = TAKE[kind](manager)
        wait_for(lambda: all(_names_held(node) for node in cluster3), "a node never took it")
        with cluster3[2].paused_while():  # its reply comes after the quorum's
            lease.release()
        # The process does nothing more with the manager: the node must free it on its own.
        wait_for(lambda: _names_held(cluster3[2]) == 0, "the late node kept the lock")
    finally:
        manager.close()


@pytest.mark.parametrize("kind", sorted(TAKE))
def test_asyncio_the_first_release_of_every_kind_reaches_a_node_that_answers_late(cluster3, kind):
    """The same with the asyncio transport, whose event loop ends right after the release
    (a management command's ``asyncio.run``): nobody reads the late node's reply."""

    async def take_and_release() -> None:
        manager = AsyncLockManager(cluster3.urls, node_timeout=0.5)
        try:
            lease = await TAKE[kind](manager)
            while not all(_names_held(node) for node in cluster3):
                await asyncio.sleep(0.01)
            with cluster3[2].paused_while():
                await lease.release()
        finally:
            await manager.aclose()

    asyncio.run(asyncio.wait_for(take_and_release(), 10.0))
    wait_for(lambda: _names_held(cluster3[2]) == 0, "the late node kept the lock")
