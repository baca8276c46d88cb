"""Auto-extension, loss notification, max_hold, the holder's metadata, and the observer."""

from __future__ import annotations

import asyncio
import gc
import os
import threading
import time
import weakref

import pytest

from django_redlock import AsyncLockManager, LockContended, LockLost, LockManager
from tests.helpers import node_client

WAIT = 10.0  # generous upper bound for events from the extender thread


class Recorder:
    """A LockObserver that records events and lets tests wait for them."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []
        self.extended_event = threading.Event()
        self.lost_event = threading.Event()
        self.extensions = 0
        self.lost_reasons: list[str] = []
        self.waits: list[float] = []
        self.holds: list[float] = []

    def acquired(self, lease, waited):
        self.events.append(("acquired", lease.name))
        self.waits.append(waited)

    def released(self, lease, held):
        self.events.append(("released", lease.name))
        self.holds.append(held)

    def extended(self, lease, validity):
        self.extensions += 1
        if self.extensions >= 3:
            self.extended_event.set()

    def lost(self, lease, reason):
        self.events.append(("lost", lease.name))
        self.lost_reasons.append(reason)
        self.lost_event.set()

    def gave_up(self, error, waited):
        self.events.append(("gave_up", error.name))


def test_auto_extension_keeps_a_short_lease_alive_and_reports_loss(cluster3):
    recorder = Recorder()
    manager = LockManager(cluster3.urls, observer=recorder)
    lease = manager.acquire("renewed", ttl=0.3, auto_extend=True)
    assert lease.auto_extended is True
    # Three renewals at ttl/3 take the lease past its original 0.3 s.
    assert recorder.extended_event.wait(WAIT)
    assert not lease.lost
    lease.check()
    # The keys vanish on a majority (as if those nodes lost them): the next renewal fails.
    for node in cluster3.nodes[:2]:
        with node_client(node) as client:
            client.delete(lease.key)
    assert recorder.lost_event.wait(WAIT)
    assert (lease.lost, lease.auto_extended) == (True, False)
    with pytest.raises(LockLost, match="no longer held by a quorum"):
        lease.check()
    with pytest.raises(LockLost):
        lease.release()
    assert recorder.events == [
        ("acquired", "renewed"),
        ("lost", "renewed"),
        ("released", "renewed"),
    ]


def test_release_stops_the_extension(cluster3):
    recorder = Recorder()
    manager = LockManager(cluster3.urls, observer=recorder)
    lease = manager.acquire("stop", ttl=0.3, auto_extend=True)
    assert recorder.extended_event.wait(WAIT)
    lease.release()
    assert not lease.auto_extended
    count = recorder.extensions
    # A new holder can take it at once, and the old lease is never renewed again.
    other = LockManager(cluster3.urls).acquire("stop", ttl=5.0, blocking=False)
    other.release()
    assert recorder.extensions in (count, count + 1)  # at most one renewal was in flight
    assert not recorder.lost_event.is_set()


def test_max_hold_stops_renewal_so_the_lease_runs_out(cluster3):
    manager = LockManager(cluster3.urls)
    lease = manager.acquire("stuck", ttl=0.3, auto_extend=True, max_hold=0.4)
    deadline = time.monotonic() + WAIT
    while not lease.lost:  # the renewals stop after 0.4 s; the lease then ends within a ttl
        assert time.monotonic() < deadline, "max_hold did not end the lease"
        time.sleep(0.01)
    # Another client can take the lock now.
    deadline = time.monotonic() + WAIT
    while True:
        try:
            LockManager(cluster3.urls).acquire("stuck", ttl=5.0, blocking=False).release()
            break
        except LockContended:
            assert time.monotonic() < deadline


def test_max_hold_needs_auto_extend(cluster3):
    with pytest.raises(ValueError, match="max_hold only applies with auto_extend=True"):
        LockManager(cluster3.urls).acquire("x", max_hold=5.0)


def test_holder_names_host_pid_thread_and_origin(cluster3):
    manager = LockManager(cluster3.urls)
    assert manager.holder("free") is None
    lease = manager.acquire("held", ttl=10.0, origin="orders.views.pay")
    lease.extend()
    owner = manager.holder("held")
    assert owner is not None
    assert owner["pid"] == os.getpid()
    assert owner["origin"] == "orders.views.pay"
    assert owner["thread"] == threading.current_thread().name
    assert owner["task"] is None
    assert owner["nodes"] == 3
    assert 9.0 < owner["ttl"] <= 10.0
    assert abs(owner["acquired_at"] - time.time()) < 60
    assert lease.token not in repr(owner)
    lease.release()


def test_the_owner_names_the_asyncio_task(cluster3):
    manager = LockManager(cluster3.urls)

    async def take() -> None:
        lease = manager.acquire("in-task", ttl=10.0)
        owner = manager.holder("in-task")
        assert owner is not None
        assert owner["task"] == "worker-7"
        lease.release()

    async def main() -> None:
        await asyncio.create_task(take(), name="worker-7")

    asyncio.run(main())


def test_the_observer_hears_acquire_release_and_give_up(cluster3, clock):
    recorder = Recorder()
    manager = LockManager(cluster3.urls, observer=recorder, clock=clock, sleep=clock.sleep)
    lease = manager.acquire("seen", ttl=5.0)
    clock.advance(1.5)
    lease.release()
    holder = LockManager(cluster3.urls).acquire("seen", ttl=5.0)
    with pytest.raises(LockContended):
        manager.acquire("seen", timeout=1.0)
    holder.release()
    assert recorder.events == [("acquired", "seen"), ("released", "seen"), ("gave_up", "seen")]
    assert recorder.holds == [pytest.approx(1.5)]
    assert recorder.waits == [0.0]


def test_an_auto_extended_lease_dropped_without_release_runs_out(cluster3):
    """Nothing keeps a forgotten lease alive: the extender and the re-entry registry hold it
    weakly, so it stops being renewed and the lock is free within its ttl."""
    manager = LockManager(cluster3.urls)
    lease = manager.acquire("forgotten", ttl=1.0, auto_extend=True)
    reference = weakref.ref(lease)
    del lease
    gc.collect()
    assert reference() is None
    rival = LockManager(cluster3.urls, retry_delay=0.05)
    rival.acquire("forgotten", ttl=5.0, timeout=3.0).release()  # about 1 s, not never


class _FailsOnAcquired:
    """An observer that breaks its contract ("must not raise") once, on ``acquired``."""

    def __init__(self) -> None:
        self.armed = True

    def acquired(self, lease, waited):
        if self.armed:
            self.armed = False
            raise RuntimeError("observer failed")

    def released(self, lease, held):
        pass

    def extended(self, lease, validity):
        pass

    def lost(self, lease, reason):
        pass

    def gave_up(self, error, waited):
        pass


def _free_everywhere(cluster, key: str) -> None:
    deadline = time.monotonic() + 5.0
    while True:
        held = 0
        for node in cluster:
            with node_client(node) as client:
                held += client.exists(key)
        if held == 0:
            return
        assert time.monotonic() < deadline, f"{key} still held on {held} nodes"
        time.sleep(0.005)


def test_an_acquire_whose_observer_raises_holds_nothing(cluster3):
    # The round was won but the caller never gets the lease: it must not stay registered
    # for re-entry (a re-entrant acquire would get a lease whose keys are gone), nor be
    # renewed, nor keep its keys.
    manager = LockManager(cluster3.urls, observer=_FailsOnAcquired())
    with pytest.raises(RuntimeError, match="observer failed"):
        manager.acquire("observed", ttl=30.0, auto_extend=True)
    _free_everywhere(cluster3, "redlock:observed")
    with manager.acquire("observed", ttl=30.0) as lease:  # not a re-entry of the lost one
        assert lease.depth == 1
        with pytest.raises(LockContended):
            LockManager(cluster3.urls).acquire("observed", ttl=30.0, blocking=False)


def test_an_acquire_whose_observer_raises_is_let_go_even_while_its_error_is_kept(cluster3):
    # The error kept (as a caller logging it later would) keeps its traceback, whose frames
    # keep the lease object alive: only letting it go, not its weak references dying,
    # keeps a re-entrant acquire from getting it back with its keys being freed.
    manager = LockManager(cluster3.urls, observer=_FailsOnAcquired())
    with pytest.raises(RuntimeError, match="observer failed") as raised:
        manager.acquire("observed-kept", ttl=30.0)
    _free_everywhere(cluster3, "redlock:observed-kept")
    with manager.acquire("observed-kept", ttl=30.0) as lease:  # not a re-entry
        assert lease.depth == 1
        with pytest.raises(LockContended):
            LockManager(cluster3.urls).acquire("observed-kept", ttl=30.0, blocking=False)
    assert raised.value.__traceback__ is not None


def test_an_adopt_whose_observer_raises_hands_the_lease_back(cluster3):
    lease = LockManager(cluster3.urls).acquire("observed-adopt", ttl=30.0)
    handle = lease.handle()
    adopter = LockManager(cluster3.urls, observer=_FailsOnAcquired())
    with pytest.raises(RuntimeError, match="observer failed"):
        adopter.adopt(handle, auto_extend=True)
    adopted = adopter.adopt(handle)  # handed back: the same handle works, once
    assert adopted.depth == 1
    adopted.release()


def test_an_asyncio_acquire_whose_observer_raises_holds_nothing(cluster3):
    async def main() -> None:
        manager = AsyncLockManager(cluster3.urls, observer=_FailsOnAcquired())
        with pytest.raises(RuntimeError, match="observer failed"):
            await manager.acquire("observed-async", ttl=30.0)
        await asyncio.to_thread(_free_everywhere, cluster3, "redlock:observed-async")
        async with await manager.acquire("observed-async", ttl=30.0) as lease:
            assert lease.depth == 1
        await manager.aclose()

    asyncio.run(main())
