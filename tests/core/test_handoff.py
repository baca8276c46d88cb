"""Hand-off: ``lease.handle()`` in one process, ``m.adopt(handle)`` in another (real nodes)."""

from __future__ import annotations

import asyncio
import logging
import pickle
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from django_redlock import (
    AsyncLockManager,
    LeaseReleased,
    LockContended,
    LockLost,
    LockManager,
    QuorumUnreachable,
)
from django_redlock.core.handle import LeaseHandle, as_handle
from django_redlock.wire.scripts import RELEASE
from tests.helpers import lock_token, node_client

ROOT = Path(__file__).resolve().parents[2]


def _holds(cluster, key: str, token: str) -> int:
    """How many nodes hold ``key`` with ``token``."""
    count = 0
    for node in cluster:
        with node_client(node) as client:
            count += lock_token(client, key) == token.encode()
    return count


def test_the_adopter_holds_the_lock_and_the_giver_lets_go(cluster3, caplog):
    giver, adopter = LockManager(cluster3.urls), LockManager(cluster3.urls)
    caplog.set_level(logging.DEBUG, logger="django_redlock")
    with giver.lock("invoice:7", ttl=10.0) as lease:
        handle = lease.handle()
        # This process let go: no I/O, the with block releases nothing.
        assert lease.released is True
        with pytest.raises(LeaseReleased):
            lease.check()
        adopted = adopter.adopt(handle.dumps())
    assert adopted.name == "invoice:7"
    assert adopted.token != lease.token
    assert _holds(cluster3, adopted.key, adopted.token) == 3
    assert 0 < adopted.validity <= 10.0
    with pytest.raises(LockContended):
        LockManager(cluster3.urls).acquire("invoice:7", blocking=False)
    assert adopted.extend() > 9.0  # extends to the handle's ttl
    # The giver's token is refused on every node: a late release cannot free the lock.
    for node in cluster3:
        with node_client(node) as client:
            assert client.eval(RELEASE.source, 1, adopted.key, lease.token, "") == 0
    assert _holds(cluster3, adopted.key, adopted.token) == 3
    adopted.release()
    assert LockManager(cluster3.urls).locked("invoice:7") is False
    # The token is a bearer secret: not in the handle's repr or str, nor in any log record.
    for text in (
        repr(handle),
        str(handle),
        repr(adopted),
        *(r.getMessage() for r in caplog.records),
    ):
        assert lease.token not in text
        assert adopted.token not in text
    assert "handed off 'invoice:7'" in caplog.text
    assert "adopted 'invoice:7'" in caplog.text


def test_a_handle_is_adopted_once(cluster3):
    lease = LockManager(cluster3.urls).acquire("once", ttl=10.0)
    # The acquire returned at a quorum: let its SET reach the third node too, so that the
    # hand-off finds the lease everywhere (else the adopter holds a quorum of 2, rightly).
    deadline = time.monotonic() + 5.0
    while _holds(cluster3, lease.key, lease.token) < 3:
        assert time.monotonic() < deadline
        time.sleep(0.002)
    handle = pickle.loads(pickle.dumps(lease.handle()))  # noqa: S301 (our own bytes)
    first = LockManager(cluster3.urls).adopt(handle)
    with pytest.raises(LockLost, match="ran out or was taken"):
        LockManager(cluster3.urls).adopt(handle)
    assert _holds(cluster3, first.key, first.token) == 3  # the failed adopt freed nothing
    first.release()


def test_a_lease_released_or_expired_on_the_nodes_cannot_be_adopted(cluster3):
    manager = LockManager(cluster3.urls)
    handle = manager.acquire("gone", ttl=10.0).handle()
    manager.force_release("gone")  # an operator; or the keys expired
    with pytest.raises(LockLost):
        manager.adopt(handle)
    assert manager.locked("gone") is False
    # And once handed off, the lease itself can be handed off no more.
    lease = manager.acquire("twice", ttl=10.0)
    lease.handle()
    with pytest.raises(LeaseReleased):
        lease.handle()


def test_adopt_works_with_a_paused_minority_and_keeps_the_fencing_token(cluster3):
    manager = LockManager(cluster3.urls, node_timeout=0.2)
    lease = manager.acquire("paused", ttl=10.0)
    lease.fencing_token = 41
    handle = lease.handle()
    cluster3[2].pause()
    try:
        adopted = LockManager(cluster3.urls, node_timeout=0.2).adopt(handle)
        assert adopted.fencing_token == 41
        assert _holds(cluster3.nodes[:2], adopted.key, adopted.token) == 2
    finally:
        cluster3[2].resume()
    adopted.release()


def test_a_quorum_of_refusals_is_lock_lost_and_frees_the_new_token(cluster3):
    manager = LockManager(cluster3.urls)
    lease = manager.acquire("split", ttl=10.0)
    handle = lease.handle()
    for node in cluster3.nodes[:2]:  # the lock is gone on two nodes: no quorum to adopt
        with node_client(node) as client:
            client.delete(lease.key)
    with pytest.raises(LockLost, match="adopted on 1 of 3 nodes"):
        manager.adopt(handle)
    # The node that handed over its key got it freed again: the lock is free everywhere.
    with node_client(cluster3[2]) as client:
        assert client.exists(lease.key) == 0


def _wait_held_by(cluster, key: str, token: str, count: int) -> None:
    deadline = time.monotonic() + 5.0
    while _holds(cluster, key, token) != count:
        if time.monotonic() > deadline:
            seen = []
            for node in cluster:
                with node_client(node) as client:
                    seen.append((client.get(key), client.pttl(key)))
            raise AssertionError(f"{key} never held by {token[:6]} on {count} nodes: {seen}")
        time.sleep(0.005)


@pytest.mark.parametrize("warm", [True, False], ids=["warm", "first-contact"])
def test_an_adopt_no_quorum_answered_hands_the_lease_back(cluster3, warm):
    # A brief outage of a majority during adopt() must not destroy a lease that nobody gave
    # up: the keys go back to the handle's token, and the same handle works afterwards
    # (found by an adversarial test: the failed adopt's clean-up deleted the keys).
    lease = LockManager(cluster3.urls).acquire("outage", ttl=20.0)
    handle = lease.handle()
    adopter = LockManager(cluster3.urls, node_timeout=0.05)
    if warm:
        adopter.acquire("warm-up", ttl=5.0).release()
    with (
        cluster3[1].paused_while(),
        cluster3[2].paused_while(),
        pytest.raises(QuorumUnreachable) as unreachable,
    ):
        adopter.adopt(handle)
    assert unreachable.value.votes <= 1
    # Each resumed node runs what it was sent, in order: the hand-off, then the hand-back.
    _wait_held_by(cluster3, lease.key, handle.token, 3)
    adopted = adopter.adopt(handle)
    assert adopted.remaining() > 15.0  # what the lease had left, not a new one
    adopted.release()
    assert adopter.locked("outage") is False


def test_an_asyncio_adopt_no_quorum_answered_hands_the_lease_back(cluster3):
    lease = LockManager(cluster3.urls).acquire("outage", ttl=20.0)
    handle = lease.handle()

    async def main() -> None:
        adopter = AsyncLockManager(cluster3.urls, node_timeout=0.05)
        with (
            cluster3[1].paused_while(),
            cluster3[2].paused_while(),
            pytest.raises(QuorumUnreachable),
        ):
            await adopter.adopt(handle)
        await asyncio.to_thread(_wait_held_by, cluster3, lease.key, handle.token, 3)
        async with await adopter.adopt(handle) as adopted:
            assert adopted.remaining() > 15.0
        await adopter.aclose()

    asyncio.run(main())


def test_an_adopt_in_progress_shows_no_token(cluster3):
    # Its repr is what a traceback's locals or an error tracker's frame capture would show.
    manager = LockManager(cluster3.urls)
    handle = manager.acquire("secret", ttl=10.0).handle()
    adoption = manager.engine.adoption(handle, False, None, None)
    assert handle.token not in repr(adoption)
    assert adoption.token not in repr(adoption)
    manager.adopt(handle).release()


def test_bad_handles_are_refused_naming_the_argument(cluster3):
    manager = LockManager(cluster3.urls)
    with pytest.raises(TypeError, match="handle must be"):
        manager.adopt(42)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="handle is not a lease handle"):
        manager.adopt("rlh1.not-base64!")
    with pytest.raises(ValueError, match="handle is not a lease handle"):
        manager.adopt("hello")
    handle = manager.acquire("prefixed", ttl=10.0).handle()
    with pytest.raises(ValueError, match="key prefix"):
        LockManager(cluster3.urls, key_prefix="other:").adopt(handle)
    forged = LeaseHandle(name="prefixed", key=handle.key, token="x" * 3, ttl=10.0)
    with pytest.raises(ValueError, match="no valid lease token"):
        manager.adopt(forged)
    unicode_token = LeaseHandle(name="prefixed", key=handle.key, token="é" * 40, ttl=10.0)
    with pytest.raises(ValueError, match="no valid lease token"):
        manager.adopt(unicode_token)
    for name in ("", "x" * 2000, "a\x00b"):
        bad_name = LeaseHandle(name=name, key="redlock:x", token=handle.token, ttl=10.0)
        with pytest.raises(ValueError, match="handle names no valid lock: name"):
            manager.adopt(bad_name.dumps())
    long_ttl = LockManager(cluster3.urls, max_ttl=300.0).acquire("long", ttl=120.0).handle()
    with pytest.raises(ValueError, match="handle: its lease's ttl does not fit this manager"):
        manager.adopt(long_ttl)  # this manager's max_ttl is 60 s
    assert LeaseHandle.loads(handle.dumps()) == handle


def test_the_asyncio_manager_adopts_too(cluster3):
    lease = LockManager(cluster3.urls).acquire("async", ttl=10.0)
    text = lease.handle().dumps()

    async def main() -> tuple[str, bool]:
        manager = AsyncLockManager(cluster3.urls)
        async with await manager.adopt(text) as adopted:
            held = await adopted.owned()
            token = adopted.token
        await manager.aclose()
        return token, held

    token, held = asyncio.run(main())
    assert held is True
    assert _holds(cluster3, lease.key, token) == 0  # released by the async with
    assert LockManager(cluster3.urls).locked("async") is False


def test_a_view_acquires_and_another_process_finishes_the_work(cluster3):
    # The story: one process takes the lock and hands it over; a worker process adopts it,
    # works, and releases; the first process's late release is refused, not a double one.
    lease = LockManager(cluster3.urls).acquire("report:9", ttl=10.0)
    text = lease.handle().dumps()
    script = textwrap.dedent(
        f"""
        from django_redlock import LockManager
        manager = LockManager({cluster3.urls!r})
        with manager.adopt({text!r}) as lease:
            assert manager.holder("report:9") is not None
            print("adopted", lease.owned())
        print("free", not manager.locked("report:9"))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["adopted", "True", "free", "True"]
    with pytest.raises(LeaseReleased):
        lease.release()


def test_an_adopted_lease_with_little_left_is_renewed_before_it_runs_out(cluster3, monkeypatch):
    # The adopter keeps only the validity the giver had. Its first background renewal must
    # come within that, not a third of the ttl later (found by the Celery once lease: a copy
    # that waited most of once_ttl in the queue lost its lease before the first renewal).
    from django_redlock.core import extender

    due: list[float] = []
    monkeypatch.setattr(extender, "schedule", lambda lease, at: due.append(at))
    giver, adopter = LockManager(cluster3.urls), LockManager(cluster3.urls)
    lease = giver.acquire("report:9", ttl=30.0)
    for node in cluster3:
        with node_client(node) as client:
            client.pexpire(lease.key, 3000)  # as if the lease had waited 27 s in a queue
    adopted = adopter.adopt(lease.handle(), auto_extend=True)
    try:
        assert adopted.validity < 3.0
        assert len(due) == 1
        assert due[0] - time.monotonic() < adopted.validity
    finally:
        adopted.release()


def test_a_handles_strings_and_numbers_are_taken_as_plain_ones():
    """What an adopted lease keeps in its state must refer to nothing (a held lease may be
    untracked by the collector: core.lease's _cycle_free), so a handle's key and token given
    as ``str`` subclasses, and its fencing token as an ``int`` subclass, come out plain."""

    class Carrying(str):
        pass

    class Counting(int):
        pass

    handle = as_handle(
        LeaseHandle(
            name="plain",
            key=Carrying("redlock:plain"),
            token=Carrying("ab" * 20),
            ttl=10.0,
            fencing_token=Counting(7),
        )
    )
    assert type(handle.key) is str
    assert type(handle.token) is str
    assert type(handle.fencing_token) is int
    assert (handle.key, handle.token, handle.fencing_token) == ("redlock:plain", "ab" * 20, 7)
