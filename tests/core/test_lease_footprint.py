"""Held leases are cheap for the garbage collector (issue 28, item 4).

A full collection visits every object the collector tracks and every reference in them, so a
process holding tens of thousands of leases paid pauses that grew with them (57 ms at ~52k
leases of 3 tracked objects each). These tests check the structure, not timings
(``python -m benchmarks.gc_pause`` measures those): a lease has no ``__dict__``, refers to no
object of its own that the collector tracks, keeps its own values (strings, floats) in one
tuple the collector does not track, so that a collection visits few references per lease,
costs no tracked object while held by a thread holding many (the lease, the re-entry
registry's weak reference to it and the thread's dict of them are untracked: none can be in a
cycle), so that a collection reads one object of its own (the lease, where its holder refers to
it: less than the pure-Python floor's two), is tracked again once released, is in no reference
cycle, and is freed by reference counting alone once dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import sys
import threading
import time
import types
import weakref
from array import array
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest
import redis

from django_redlock import LockManager
from django_redlock.aredlock import AsyncLease, AsyncLockManager
from django_redlock.core import extender
from django_redlock.core import lease as lease_module
from django_redlock.core import untracking as untracking_module
from django_redlock.core.manager import Lease
from django_redlock.core.reentry import Reentry
from django_redlock.core.untracking import UNTRACK_AT
from django_redlock.exceptions import LeaseReleased, LockLost
from django_redlock.procedures.shapes import Shape
from django_redlock.wire.scripts import PING
from tests.core.test_async_lease import keys_left
from tests.core.test_fork import in_child, in_child_while_held
from tests.helpers import node_client, votes_recorded

_M = TypeVar("_M")

# Enough leases that what other threads of the run allocate meanwhile (a few dozen objects)
# stays far below one more tracked object per lease.
COUNT = 2000


@pytest.fixture
def no_automatic_collection() -> Iterator[None]:
    """The collector runs only when the test asks: a cycle cannot be freed unseen."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def own_tracked(obj: object) -> list[object]:
    """What ``obj`` refers to that the collector tracks, its class aside."""
    return [ref for ref in gc.get_referents(obj) if gc.is_tracked(ref) and ref is not type(obj)]


def tracked() -> int:
    gc.collect()  # also stops tracking tuples that hold only strings and numbers
    return len(gc.get_objects())


def touched() -> array[int]:
    """What a full collection reads: every object it tracks and every object they refer to
    (each a header read, and a likely cache miss when it is no other lease's), by id. In an
    array, which the collector neither tracks nor visits (a set of the ids would be one more
    object referring to all of them)."""
    gc.collect()
    seen: set[int] = set()
    for obj in gc.get_objects():
        seen.add(id(obj))
        if not issubclass(type(obj), types.ModuleType):  # see _no_module_referents
            seen.update(id(ref) for ref in gc.get_referents(obj))
    return array("q", seen)


def added(before: array[int], after: array[int]) -> int:
    """How many objects a collection reads in ``after`` that it did not in ``before``."""
    return len(set(after) - set(before))


def per_batch(
    manager: LockManager,
    name: str,
    measure: Callable[[], _M],
    difference: Callable[[_M, _M], int],
    check: Callable[[list[Lease]], None] | None = None,
    **options: Any,
) -> list[int]:
    """``difference(before, after)`` of ``measure()`` around taking COUNT leases, for three
    batches (each released before the next). Assert on the fewest: what other threads
    allocate meanwhile (a loaded machine's late replies, a fixture's output reader) only ever
    adds to a batch's count, where one more object or reference per lease adds COUNT to
    every batch (CI under load saw one batch over its limit more than once)."""
    counts = []
    for batch in range(3):
        answered(manager)
        before = measure()
        leases = [manager.acquire(f"{name}-{batch}-{i}", **options) for i in range(COUNT)]
        answered(manager)
        counts.append(difference(before, measure()))
        if check is not None:
            check(leases)
        for lease in leases:
            lease.release()
        del leases
    return counts


def answered(manager: LockManager) -> None:
    """Read every reply this thread's connections still owe: a round whose PING waits for
    every node, answered after all that was sent before it. On a loaded machine a node
    falls behind and owes the replies of rounds decided without it (up to 128 here), each
    keeping its round's objects until read: not objects of a held lease."""
    nodes = len(manager.engine.addresses)
    connections = manager.engine.connections.get()
    deadline = time.monotonic() + 30.0  # a hang guard: a loaded node catches up well before
    while True:
        # A node owing more than a clean-up may queue behind is refused at once: the round
        # still waits for the others (give_up), and reads what that node owes meanwhile.
        exchange = connections.run([PING] * nodes, 1.0, b"PONG", nodes, give_up=nodes)
        if exchange.yes == nodes:
            return
        assert time.monotonic() < deadline, exchange.results


def subtract(before: int, after: int) -> int:
    return after - before


def visited() -> int:
    """The references a full collection visits in the objects it tracks."""
    gc.collect()
    return sum(
        len(gc.get_referents(obj))
        for obj in gc.get_objects()
        if not issubclass(type(obj), types.ModuleType)  # see _no_module_referents
    )


# _no_module_referents: neither helper asks for a module's referents (a module refers to its
# dict, which the collector tracks and both count on its own; no lease adds to it). On
# CPython 3.12 before 3.12.5, gc.get_referents(_asyncio) hands out the freed future
# iterators of that module's free list, and the next collection never returns
# (python/cpython#122695): these tests hung on 3.12.1 once an asyncio manager had run.
# type(obj), not isinstance: isinstance reads __class__, which a proxy (celery's
# current_app, say) answers by evaluating itself.


# What a full collection visits in a held plain lock's lease: its 7 slots (not __weakref__,
# which it does not visit): the engine, the untracked tuple of its own values (with the
# held-nodes tuple and the fencing token), and objects many leases share (None, small ints,
# the thread's owner scope); and its class. Each is a call, and each of the lease's own
# objects a likely cache miss: there were 19, two of them its own, before issue 28 item 4.
LEASE_REFERENCES = 8


def test_a_held_lease_has_no_dict_and_refers_to_nothing_tracked_of_its_own(cluster3):
    manager = LockManager(cluster3.urls)
    lease = manager.acquire("footprint", ttl=10.0)
    other = manager.acquire("footprint-2", ttl=10.0)
    # Twice: the first lease held on these nodes in this process made the shared held-nodes
    # tuple its state refers to, which may sit in an older generation, visited after the
    # state by a full collection; the state is untracked by the next one.
    gc.collect()
    gc.collect()
    assert not hasattr(lease, "__dict__")
    assert not hasattr(lease._shape, "__dict__")
    # Only the engine, shared by every lease its managers made (and the class, as for any object).
    assert own_tracked(lease) == [manager.engine]
    assert own_tracked(other) == [manager.engine]
    # A lock's shape is made for each round, not kept (a semaphore's or a read-write lease's,
    # which hold state, are kept).
    assert lease._special_shape is None
    assert type(lease._shape) is Shape
    assert lease._shape.key == lease.key
    lease.release()
    other.release()


def test_a_held_lease_keeps_its_own_values_in_one_untracked_tuple(cluster3):
    manager = LockManager(cluster3.urls)
    lease = manager.acquire("own-values", ttl=10.0, origin="tests")
    gc.collect()
    assert len(gc.get_referents(lease)) <= LEASE_REFERENCES
    # The strings and floats that are the lease's own (name, key, token, owner record,
    # expiry...) are one object to visit, which the collector does not even track.
    assert not gc.is_tracked(lease._state)
    own = {id(value) for value in (lease.name, lease.key, lease.token, lease.ttl, lease.origin)}
    assert not own & {id(ref) for ref in gc.get_referents(lease)}
    # A renewal replaces the tuple with another of atomics: still untracked after a collection.
    lease.extend()
    gc.collect()
    assert not gc.is_tracked(lease._state)
    assert len(gc.get_referents(lease)) <= LEASE_REFERENCES
    # A fenced lease's token (an int of its own, beyond the cached small ones) is in the
    # tuple too, and survives a renewal.
    token = 10**12 + 7
    lease.fencing_token = token
    lease.extend()
    gc.collect()
    assert lease.fencing_token == token
    assert not gc.is_tracked(lease._state)
    assert all(ref != token for ref in gc.get_referents(lease))
    assert len(gc.get_referents(lease)) <= LEASE_REFERENCES
    lease.release()


def test_holding_leases_costs_no_tracked_object_each(cluster3):
    manager = LockManager(cluster3.urls)
    manager.acquire("warm-up", ttl=10.0).release()  # connections, caches, owner prefix
    counts = per_batch(manager, "count", tracked, subtract, ttl=10.0)
    # Past the first few of a thread's: neither the lease nor the weak reference by which
    # its owner may re-enter it (see core.untracking and core.lease.cycle_free). A little
    # slack for what else the rounds allocate (replies, log records) and the first few
    # leases and weak references. One tracked object per lease was COUNT more.
    assert min(counts) <= 2 * UNTRACK_AT + 100, counts


def test_holding_auto_extended_leases_costs_no_tracked_object_each(cluster3):
    manager = LockManager(cluster3.urls)
    manager.acquire("warm-up", ttl=60.0, auto_extend=True).release()  # the extender thread

    def turn_a_flag_and_working(leases: list[Lease]) -> None:
        # Its turn (core.turns) is a flag, False or True, which every lease shares.
        assert all(lease._guard is False for lease in leases)
        leases[0].extend()  # the turn is taken and given back
        assert leases[0]._guard is False

    # First renewed after 20 s: none while the test runs.
    counts = per_batch(
        manager, "auto", tracked, subtract, turn_a_flag_and_working, ttl=60.0, auto_extend=True
    )
    # Not the lease (untracked, as a plain one), its turn (a flag), the weak reference that
    # the re-entry registry and the extender share (untracked), nor the extender's heap
    # entry, a pair of numbers the collector does not track.
    assert min(counts) <= 2 * UNTRACK_AT + 100, counts


def test_holding_leases_costs_few_references_to_visit_each(cluster3):
    manager = LockManager(cluster3.urls)
    manager.acquire("warm-up", ttl=10.0).release()
    counts = per_batch(manager, "visits", visited, subtract, ttl=10.0)
    # The list's reference here: 1. None of the lease's own (LEASE_REFERENCES: it is
    # untracked), nor the re-entry registry's: the weak reference is in a dict the collector
    # does not track (a thread's scope holding many leases: see lease.Reentry.put).
    assert min(counts) <= COUNT + (LEASE_REFERENCES + 1) * UNTRACK_AT + 500, counts


def test_leases_make_no_reference_cycles(cluster3, no_automatic_collection):
    manager = LockManager(cluster3.urls)
    manager.acquire("warm-up", ttl=10.0).release()
    gc.collect()
    for i in range(COUNT):
        with manager.lock(f"cycle-{i}", ttl=10.0):
            pass
        manager.acquire(f"cycle-{i}", ttl=10.0, auto_extend=True).release()
    # Only what this library made: a thread left by an earlier test (in a random order) may
    # leave cyclic garbage of its own meanwhile. A cycle through a lease takes the lease, or
    # a frame of ours holding it, into the garbage too.
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        ours = [
            obj
            for obj in gc.garbage
            if type(obj).__module__.startswith("django_redlock")
            or (isinstance(obj, types.FrameType) and "django_redlock" in obj.f_code.co_filename)
        ]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert ours == []


def test_a_dropped_lease_is_freed_at_once_by_reference_counting(cluster3, no_automatic_collection):
    """No cycle holds a lease dropped without release: it goes at once (its keys run out by
    their ttl), and so does the re-entry registry's entry."""
    manager = LockManager(cluster3.urls)
    lease = manager.acquire("dropped", ttl=10.0, auto_extend=True)
    gone = weakref.ref(lease)
    del lease
    assert gone() is None
    assert len(manager.engine.held) == 0


def test_a_thread_holding_many_leases_still_holds_them_weakly(cluster3, no_automatic_collection):
    """Past a few leases, the thread's entries in the re-entry registry are a dict the
    collector does not track: a lease dropped without release still goes at once, one kept
    only by cyclic garbage goes with it at the next collection, and re-entry works."""
    manager = LockManager(cluster3.urls)
    held = manager.engine.held
    leases = [manager.acquire(f"weakly-{i}", ttl=10.0) for i in range(4 * UNTRACK_AT)]
    scope = leases[0]._scope
    assert scope is not None
    assert scope[2] is None  # a thread's
    entries = held._scopes[scope]
    assert not gc.is_tracked(entries)
    assert manager.acquire("weakly-0", ttl=10.0) is leases[0]  # re-entered
    assert leases[0].depth == 2
    leases[0].release()
    # Dropped without release: freed by reference counting (its keys run out by their ttl).
    gone = weakref.ref(leases.pop())
    assert gone() is None
    assert held.get(scope, f"weakly-{len(leases)}") is None
    # Kept only by a reference cycle: freed by the collector, which clears the weak
    # reference in the untracked dict as it frees it.
    kept = leases.pop()
    gone = weakref.ref(kept)
    cycle: list[object] = [kept]
    cycle.append(cycle)
    del kept
    del cycle
    assert gone() is not None
    gc.collect()
    assert gone() is None
    assert held.get(scope, f"weakly-{len(leases)}") is None
    assert len(held) == len(leases)
    assert not gc.is_tracked(entries)
    for lease in leases:
        lease.release()
    assert len(held) == 0


# What a collection reads per held lease that is no other lease's: the lease, where its holder
# refers to it (the list here). Not the untracked tuple of its own values (the lease, untracked,
# is not traversed: the pure-Python floor, benchmarks.gc_model.FloorLease, reads both), nor
# the registry's weak reference to it (untracked, in a thread's dict the collector does not
# track once it holds many), nor a key tuple per registry entry (the registry keys a dict per
# owner scope by name), nor an owner scope tuple per lease (an asyncio lease keeps its task's
# one, which the registry holds).
OWN_OBJECTS = 1
# An asyncio lease's: as a sync lease's. Its scope holds its task weakly and it holds its
# manager weakly (core.owner.owner_scope, AsyncLease), so a task holding many has its
# registry dict and its leases untracked as a thread does. (3 before: the lease tracked, its
# state tuple, and the weak reference read where the task's tracked dict refers to it.)
ASYNC_OWN_OBJECTS = 1


def test_a_held_lease_costs_a_collection_one_object_of_its_own(cluster3):
    manager = LockManager(cluster3.urls)
    manager.acquire("warm-up", ttl=10.0).release()
    votes_recorded(manager)  # the recorder's thread makes objects too: not while counting
    counts = per_batch(manager, "own", touched, added, ttl=10.0)
    # The list here adds one reference per lease but no object of its own per lease.
    assert min(counts) <= OWN_OBJECTS * COUNT + 100, counts


# An auto-extended lease's: as a plain lease's. Its turn is a flag (core.turns), where a lock
# of its own was a third object (12,025 for 2,000 leases before the extender's containers
# were untracked, 3 each after, 2 with the flag, 1 with the lease untracked). Not the
# extender's heap pair, map key or weak reference: its heap and map are containers the
# collector does not track (core.untracking).
AUTO_EXTENDED_OWN_OBJECTS = 1


def test_a_held_auto_extended_lease_costs_a_collection_one_object_of_its_own(cluster3):
    manager = LockManager(cluster3.urls)
    manager.acquire("warm-up", ttl=60.0, auto_extend=True).release()  # the extender thread
    # First renewed after 20 s: none while the test runs.
    counts = per_batch(manager, "auto-own", touched, added, ttl=60.0, auto_extend=True)
    assert min(counts) <= AUTO_EXTENDED_OWN_OBJECTS * COUNT + 100, counts
    running = extender._extender
    assert running is not None
    assert not gc.is_tracked(running.heap)
    assert not gc.is_tracked(running.leases)


def test_held_asyncio_leases_cost_what_sync_ones_do(cluster3):
    """A task's leases share one scope tuple (the registry's), and past a few they are
    objects the collector does not track, as a thread's are: a collection reads one object of
    each lease's own, the lease's header, where its holder refers to it."""
    manager = LockManager(cluster3.urls)
    shared = AsyncLockManager.sharing(manager)
    counts: dict[str, Any] = {}

    async def main() -> None:
        await (await shared.acquire("warm-up-2", ttl=10.0)).release()
        # Three batches, the fewest counted (as per_batch does for sync leases): what the
        # rounds leave meanwhile (a late reply's round, read later) only adds to a batch.
        for batch in range(3):
            before_tracked, before_touched = tracked(), touched()
            leases: list[AsyncLease] = []
            for i in range(COUNT):
                leases.append(await shared.acquire(f"async-own-{batch}-{i}", ttl=10.0))
            counts.setdefault("tracked", []).append(tracked() - before_tracked)
            counts.setdefault("own", []).append(added(before_touched, touched()))
            counts["scopes"] = len({id(lease._scope) for lease in leases})
            scope = leases[0]._scope
            assert scope is not None
            counts["task"] = scope[2]
            counts["tracked_first"] = all(
                gc.is_tracked(lease) for lease in leases[: UNTRACK_AT - 1]
            )
            counts["untracked_rest"] = not any(
                gc.is_tracked(lease) for lease in leases[UNTRACK_AT:]
            )
            counts["cycle_free"] = lease_module.cycle_free(leases[-1])
            for lease in leases:
                await lease.release()
            counts["all_tracked_after"] = all(gc.is_tracked(lease) for lease in leases)
            del leases

    asyncio.run(main())
    assert counts["scopes"] == 1  # one task: one scope tuple for all its leases
    assert type(counts["task"]) is weakref.ref  # the task, weakly
    assert counts["tracked_first"]
    assert counts["untracked_rest"]
    assert counts["cycle_free"] is True
    assert counts["all_tracked_after"]  # tracked again as each hold ended
    assert min(counts["tracked"]) <= UNTRACK_AT + 100, counts["tracked"]
    assert min(counts["own"]) <= ASYNC_OWN_OBJECTS * COUNT + 100, counts["own"]


def _abandon_a_task_holding_leases(
    urls: list[str], manager: AsyncLockManager | None = None, keep_loop: bool = False
) -> dict[str, Any]:
    """Run a task that takes many leases (every other one auto-extended) and then waits in
    the line of a lock held elsewhere, close its loop with the task pending there, and drop
    every reference to them but weak ones (returned), and to ``manager`` unless it is given,
    and to the closed loop unless ``keep_loop`` (then returned too, as ``refs["loop"]``).
    Waiting, the task is reached from its manager: the manager's connections to the loop
    reach the loop, whose timer wakes it."""
    blocker = LockManager(urls).acquire("abandoned-blocker", ttl=60.0)
    if manager is None:
        manager = AsyncLockManager(urls)
    loop = asyncio.new_event_loop()
    held = loop.create_future()
    refs: dict[str, Any] = {"manager": weakref.ref(manager)}

    async def holder() -> None:
        leases = [
            await manager.acquire(f"abandoned-{i}", ttl=60.0, auto_extend=i % 2 == 0)
            for i in range(2 * UNTRACK_AT)
        ]
        refs["leases"] = [weakref.ref(lease) for lease in leases]
        refs["untracked"] = [not gc.is_tracked(lease) for lease in leases]
        held.set_result(None)
        await manager.acquire("abandoned-blocker", timeout=60.0)  # waits: left pending
        for lease in leases:  # pragma: no cover
            await lease.release()

    task = loop.create_task(holder())
    refs["task"] = weakref.ref(task)
    loop.run_until_complete(held)
    loop.run_until_complete(asyncio.sleep(0.2))  # in line, its wake-up timer set
    loop.close()
    blocker.release()
    if keep_loop:
        refs["loop"] = loop
    return refs


@pytest.fixture
def closed_loop_noise(monkeypatch: pytest.MonkeyPatch) -> None:
    """For tests that close a loop on pending tasks. Collecting what such a loop left behind
    reports errors, as it should: "Task was destroyed but it is pending", transports never
    closed, and the connections' guard, finalized, failing to close them on the closed loop.
    That is the misuse the tests make, not what they test. pytest would also keep each such
    error until the test ends, traceback and frames included, and the leases in those frames
    with them: they are dropped here, as Python does."""
    monkeypatch.setattr(sys, "unraisablehook", lambda unraisable: None)


@pytest.mark.filterwarnings("ignore::ResourceWarning")
def test_a_task_abandoned_holding_many_leases_is_freed_and_its_leases_renewed_no_more(
    cluster3, no_automatic_collection, closed_loop_noise
):
    """A pending task left on a closed loop, its frame holding many untracked leases
    (auto-extended ones among them), is found by the collector, and its leases with it: no
    lease refers to the task or to the manager whose connections hold the task's future,
    so no cycle runs through them. Were one to, the task and its leases would stay in memory
    for good, and the extender would renew those leases for ever."""
    refs = _abandon_a_task_holding_leases(cluster3.urls)
    assert refs["untracked"][UNTRACK_AT:] == [True] * UNTRACK_AT  # the case under test
    assert refs["task"]() is not None  # only a collection frees it
    gc.collect()
    gc.collect()
    assert refs["task"]() is None
    assert refs["manager"]() is None
    assert all(ref() is None for ref in refs["leases"])
    # Not renewed for ever: the extender holds none of them (it holds leases weakly).
    running = extender._extender
    if running is not None:
        alive = [ref() for ref in list(running.leases.values())]
        assert not any(isinstance(a, AsyncLease) and a.name.startswith("abandoned-") for a in alive)


def test_an_asyncio_lease_whose_manager_is_gone_is_still_released(cluster3):
    """The lease holds its manager weakly; once that manager is gone (its loop ended, and
    the caller kept only the lease), a release goes out through a new one on the same
    engine."""

    async def take() -> AsyncLease:
        return await AsyncLockManager(cluster3.urls).acquire("orphan", ttl=30.0)

    lease = asyncio.run(take())
    gc.collect()
    assert lease._manager() is None  # gone with its loop

    async def give_back() -> None:
        assert await lease.owned()
        stand_in = lease._async_manager
        assert stand_in is lease._async_manager  # one for every call in this loop
        assert stand_in.engine is lease.host
        await lease.extend()
        await lease.release()

    asyncio.run(give_back())
    assert lease.released
    # Freed on a quorum at least: the release returns at a quorum's replies, and a new
    # manager's connections to the third node may still be opening when the loop ends (the
    # key there runs out by its ttl, as for any node a release does not reach).
    assert keys_left(cluster3, lease.key) <= 1
    LockManager(cluster3.urls).acquire("orphan", blocking=False).release()


class KeepingObserver:
    """An observer that keeps every lease it is told of (a test's recorder, say)."""

    def __init__(self) -> None:
        self.leases: list[object] = []

    def acquired(self, lease: object, waited: float) -> None:
        self.leases.append(lease)

    def released(self, lease: object, held: float) -> None:
        pass

    def extended(self, lease: object, validity: float) -> None:
        pass

    def lost(self, lease: object, reason: str) -> None:
        pass

    def gave_up(self, error: object, waited: float) -> None:
        pass


class ForgettingObserver(KeepingObserver):
    """One that keeps none, and says so."""

    keeps_leases = False

    def acquired(self, lease: object, waited: float) -> None:
        pass


def test_a_thread_holding_many_leases_has_them_untracked_until_released(
    cluster3, no_automatic_collection
):
    """Past a few, a thread's held leases are objects the collector does not track (nothing
    they refer to refers back to them); each is tracked again as it leaves the registry:
    released, handed off, or let go, whatever keeps it may make a cycle with it."""
    manager = LockManager(cluster3.urls)
    leases = [manager.acquire(f"untracked-{i}", ttl=10.0) for i in range(4 * UNTRACK_AT)]
    assert all(gc.is_tracked(lease) for lease in leases[: UNTRACK_AT - 1])
    assert not any(gc.is_tracked(lease) for lease in leases[UNTRACK_AT:])
    # Re-entered, renewed, released: as any lease.
    last = leases.pop()
    assert manager.acquire(last.name, ttl=10.0) is last
    assert last.depth == 2
    last.extend()
    last.release()
    assert not gc.is_tracked(last)  # still held once
    last.release()
    assert gc.is_tracked(last)
    with pytest.raises(LeaseReleased):
        last.release()  # a second release finds it tracked, and tracks nothing again
    assert gc.is_tracked(last)
    # Handed off: tracked again too.
    given = leases.pop()
    handle = given.handle()
    assert gc.is_tracked(given)
    manager.adopt(handle).release()
    for lease in leases:
        lease.release()
    assert all(gc.is_tracked(lease) for lease in leases)


def test_leases_stay_tracked_when_the_observer_may_keep_them(cluster3, no_automatic_collection):
    """An observer that keeps leases refers to them from the engine every lease refers to: a
    cycle, which an untracked lease would hide from the collector, so that a manager dropped
    while holding them would never be freed. They stay tracked, and it is."""
    keeping = KeepingObserver()
    manager = LockManager(cluster3.urls, observer=keeping, ttl=10.0)
    leases = [manager.acquire(f"kept-{i}") for i in range(4 * UNTRACK_AT)]
    assert all(gc.is_tracked(lease) for lease in leases)
    engine = weakref.ref(manager.engine)
    manager.close()
    del manager, leases, keeping  # dropped, still held (their keys run out by their ttl)
    gc.collect()
    assert engine() is None
    # One that says it keeps none: untracked as without an observer.
    manager = LockManager(cluster3.urls, observer=ForgettingObserver(), ttl=10.0)
    leases = [manager.acquire(f"forgotten-{i}") for i in range(4 * UNTRACK_AT)]
    assert not any(gc.is_tracked(lease) for lease in leases[UNTRACK_AT:])
    for lease in leases:
        lease.release()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork() only")
def test_a_forked_child_tracks_released_leases_although_a_parent_thread_held_the_lock(cluster3):
    # A parent thread inside the lock that serialises tracking a lease again, at the instant
    # of the fork, would leave the child's copy locked for good: the child gets a new one.
    def body() -> int:
        manager = LockManager(cluster3.urls, ttl=10.0)
        leases = [manager.acquire(f"child-{i}") for i in range(2 * UNTRACK_AT)]
        if gc.is_tracked(leases[-1]):
            return 1
        for lease in leases:
            lease.release()
        return 0 if all(gc.is_tracked(lease) for lease in leases) else 2

    status = in_child_while_held(untracking_module._tracking, body)  # HUNG if a release hung
    assert status == 0


def test_leases_stay_tracked_under_an_observer_that_only_inherits_keeping_none(
    cluster3, no_automatic_collection
):
    """``keeps_leases = False`` is trusted on the observer's own class only: a subclass may
    keep what its base did not, and must say so again."""

    class Inheriting(ForgettingObserver):
        def acquired(self, lease: object, waited: float) -> None:
            self.leases.append(lease)

    manager = LockManager(cluster3.urls, observer=Inheriting(), ttl=10.0)
    leases = [manager.acquire(f"inherited-{i}") for i in range(4 * UNTRACK_AT)]
    assert all(gc.is_tracked(lease) for lease in leases)
    engine = weakref.ref(manager.engine)
    manager.close()
    del manager, leases
    gc.collect()
    assert engine() is None


def test_leases_stay_tracked_under_an_injected_clock(cluster3):
    """A clock the user gives the manager may be a method of an object that keeps leases."""
    ticks = iter(range(10**9))

    class Clock:
        def now(self) -> float:
            return float(next(ticks))

    manager = LockManager(cluster3.urls, ttl=10.0, clock=Clock().now)
    lease = manager.acquire("clocked")
    assert lease_module.cycle_free(lease) is False
    lease.release()
    plain = LockManager(cluster3.urls, ttl=10.0)
    lease = plain.acquire("clocked")
    assert lease_module.cycle_free(lease) is True
    lease.release()


def test_nothing_can_be_hung_on_the_engine_every_lease_refers_to(cluster3):
    """Code handed the engine (``lease.host``; a signal's sender when its observer has no
    manager) cannot make it refer to a lease: it has no ``__dict__``."""
    manager = LockManager(cluster3.urls)
    with pytest.raises(AttributeError):
        manager.engine.recent = []  # type: ignore[attr-defined]
    lease = manager.acquire("hung")
    with pytest.raises(AttributeError):
        lease.host.last = lease  # type: ignore[attr-defined]
    lease.release()


def test_a_release_that_fails_midway_leaves_the_lease_tracked(cluster3, monkeypatch):
    """The lease is tracked again before its hold ends: an error (or an interrupt) in the
    registry's removal leaves no released lease untracked."""
    manager = LockManager(cluster3.urls, ttl=10.0)
    leases = [manager.acquire(f"midway-{i}") for i in range(2 * UNTRACK_AT)]
    last = leases[-1]
    assert not gc.is_tracked(last)

    def failing(*args: object) -> None:
        raise RuntimeError("interrupted")

    monkeypatch.setattr(Reentry, "remove", failing)
    with pytest.raises(RuntimeError):
        last.release()
    assert gc.is_tracked(last)
    monkeypatch.undo()
    with pytest.raises(LeaseReleased):
        last.release()
    for lease in leases[:-1]:
        lease.release()


def test_a_release_on_a_thread_already_tracking_a_lease_again_does_not_deadlock(cluster3):
    """A signal handler or a finalizer may release a lease on a thread that is inside the
    lock serialising tracking (between two calls): it is re-entrant."""
    manager = LockManager(cluster3.urls, ttl=10.0)
    leases = [manager.acquire(f"reentrant-{i}") for i in range(2 * UNTRACK_AT)]
    assert not gc.is_tracked(leases[-1])
    done = threading.Event()

    def release_inside() -> None:
        with untracking_module._tracking:
            leases[-1].release()
        done.set()

    thread = threading.Thread(target=release_inside, daemon=True)
    thread.start()
    thread.join(10.0)
    assert done.is_set()
    assert gc.is_tracked(leases[-1])
    for lease in leases[:-1]:
        lease.release()


def test_a_fencing_token_is_an_int(cluster3):
    """Anything else in the lease's state could refer back to it."""
    manager = LockManager(cluster3.urls, ttl=10.0)
    lease = manager.acquire("fenced")
    for bad in ("7", 7.0, True, [7]):
        with pytest.raises(TypeError, match="fencing_token"):
            lease.fencing_token = bad
    lease.fencing_token = 10**12 + 7
    assert lease.fencing_token == 10**12 + 7
    lease.fencing_token = None
    lease.release()


class KeepingProvider(redis.CredentialProvider):
    """A redis-py credential provider that also keeps the leases of the manager built with it
    (a tenant object, say): the engine keeps it, so leases kept there close a cycle."""

    def __init__(self) -> None:
        self.held: list[object] = []

    def get_credentials(self) -> tuple[str]:
        return ("unused",)


def test_only_an_engine_given_nothing_that_could_keep_a_lease_untracks_them(cluster3):
    """What the user gives an engine is judged once, on an allow-list: a credential provider,
    a key prefix or a clock of the user's own, or an observer that does not say it keeps no
    lease, could each keep leases the engine refers to (a cycle through each lease)."""
    assert LockManager(cluster3.urls).engine.leases_untrackable
    assert LockManager(cluster3.urls, observer=ForgettingObserver()).engine.leases_untrackable
    provider = KeepingProvider()
    clients = [redis.Redis.from_url(url, credential_provider=provider) for url in cluster3.urls]
    assert not LockManager(clients).engine.leases_untrackable
    plain = [redis.Redis.from_url(url) for url in cluster3.urls]
    assert LockManager(plain).engine.leases_untrackable

    class Prefix(str):
        pass

    assert not LockManager(cluster3.urls, key_prefix=Prefix("p:")).engine.leases_untrackable
    assert not LockManager(cluster3.urls, clock=lambda: 0.0).engine.leases_untrackable
    assert not LockManager(cluster3.urls, observer=KeepingObserver()).engine.leases_untrackable


def test_names_and_origins_given_as_str_subclasses_are_kept_as_plain_str(cluster3):
    """A subclass's instance may carry anything, which the lease's state would then hold."""

    class Text(str):
        pass

    manager = LockManager(cluster3.urls, ttl=10.0)
    lease = manager.acquire(Text("sub-name"), origin=Text("sub-origin"))
    assert type(lease.name) is str
    assert lease.name == "sub-name"
    assert type(lease.origin) is str
    assert lease.origin == "sub-origin"
    lease.release()


def test_a_release_reentered_on_the_same_lease_never_tracks_it_twice(cluster3):
    """A signal handler (a graceful shutdown releasing what the process holds) may run inside
    the release of the very lease it releases, between the check and the call that track it
    again: CPython aborts the process on tracking a tracked object. The handler's release
    leaves the tracking to the interrupted one. In a child: an abort would kill the run."""

    def body() -> int:
        manager = LockManager(cluster3.urls, ttl=10.0)
        leases = [manager.acquire(f"reentered-{i}") for i in range(2 * UNTRACK_AT)]
        target = leases[-1]
        if gc.is_tracked(target):
            return 2
        real = untracking_module._is_tracked
        calls: list[object] = []

        def is_tracked(obj: object) -> bool:
            result = real(obj)
            calls.append(obj)
            if obj is target and len(calls) == 2:  # the check under the lock: "handled" here
                with contextlib.suppress(LeaseReleased, LockLost):
                    target.release()
            return result

        untracking_module._is_tracked = is_tracked
        try:
            with contextlib.suppress(LeaseReleased, LockLost):
                target.release()  # its keys were freed by the "handler"
        finally:
            untracking_module._is_tracked = real
        for lease in leases[:-1]:
            lease.release()
        return 0 if gc.is_tracked(target) and len(calls) >= 2 else 3

    assert in_child(body) == 0


def test_a_slot_taken_in_a_task_of_its_own_is_released_once_that_task_is_gone(cluster3):
    """A semaphore slot or a read lease (kinds the re-entry registry does not hold) taken in
    a task of its own (``gather``, ``wait_for`` on 3.11) and released by its caller after that
    task is freed: its scope's weak reference to the task was hashed while the task lived, so
    the release finds it (the first review of weak scopes found TypeError here, the release
    marked done and the keys left on the nodes)."""

    async def main() -> list[AsyncLease]:
        manager = AsyncLockManager(cluster3.urls)
        semaphore = manager.semaphore("in-a-task", 4)
        leases = list(
            await asyncio.gather(semaphore.acquire(auto_extend=True), semaphore.acquire())
        )
        leases.append(await asyncio.wait_for(manager.rwlock("in-a-task-rw").read(), 5.0))
        gc.collect()
        for lease in leases:
            scope = lease._scope
            assert scope is not None
            assert scope[2]() is None  # type: ignore[operator]  # the task is gone
            async with lease:
                pass
        await manager.aclose()
        return leases

    leases = asyncio.run(main())
    assert all(lease.released for lease in leases)
    for node in cluster3:
        with node_client(node) as client:
            assert client.keys("redlock:in-a-task*") == []


def test_a_manager_nobody_keeps_lives_while_its_loop_runs(cluster3, caplog):
    """Its leases hold it weakly; its connections' guard, which the loop keeps, keeps it:
    collected idle in the middle of the loop, it was freed with its guard pending ("Task was
    destroyed but it is pending"), and each later call on a lease made a new manager that
    opened new connections (the first review of weak managers)."""

    async def main() -> None:
        lease = await AsyncLockManager(cluster3.urls).acquire("nobody-keeps", ttl=30.0)
        assert lease._manager() is not None
        for _ in range(3):
            await asyncio.sleep(0.3)  # idle: every reply read, nothing in flight
            gc.collect()
            manager = lease._manager()
            assert manager is not None  # kept by its loop
            await lease.extend()
            assert await lease.owned()
            assert lease._manager() is manager
            del manager
        await lease.release()

    asyncio.run(main())
    assert "destroyed but it is pending" not in caplog.text


@pytest.mark.filterwarnings("ignore::ResourceWarning")
def test_a_kept_manager_drops_the_connections_of_a_loop_closed_on_pending_tasks(
    cluster3, no_automatic_collection, closed_loop_noise
):
    """A manager the program keeps (the process-wide one) kept, for a loop closed with a task
    pending in a lock's line, that loop's connections, whose futures hold the task and so the
    leases it holds (renewed for ever, auto-extended). Its next use on another loop drops
    them (the first review of weak managers found this, older than weak managers)."""
    manager = AsyncLockManager(cluster3.urls)
    refs = _abandon_a_task_holding_leases(cluster3.urls, manager)
    assert refs["untracked"][UNTRACK_AT:] == [True] * UNTRACK_AT
    gc.collect()
    assert refs["task"]() is not None  # the kept manager's entry for the closed loop
    asyncio.run(manager.aclose())  # used on another loop: the closed loop's entry goes
    gc.collect()
    gc.collect()
    assert refs["task"]() is None
    assert all(ref() is None for ref in refs["leases"])


def test_a_lease_of_a_shape_of_the_users_own_stays_tracked(cluster3, no_automatic_collection):
    """acquire_shape takes any Shape: one of the user's own might hold anything, the lease
    among it, so its lease stays tracked however many its thread holds."""

    class OwnShape(Shape):
        pass

    manager = LockManager(cluster3.urls)
    leases = [manager.acquire(f"own-shape-{i}", ttl=10.0) for i in range(UNTRACK_AT)]
    own = manager.acquire_shape("own-shape", OwnShape("redlock:own-shape"), ttl=10.0)
    plain = manager.acquire("own-shape-plain", ttl=10.0)
    assert gc.is_tracked(own)
    assert not gc.is_tracked(plain)  # past the threshold, as the test is meant to be
    for lease in [*leases, own, plain]:
        lease.release()


@pytest.mark.filterwarnings("ignore::ResourceWarning")
def test_a_closed_loop_still_referenced_keeps_no_task_or_lease(
    cluster3, no_automatic_collection, closed_loop_noise
):
    """A closed loop kept by the program (a variable, asyncio.set_event_loop) holds nothing
    of a task left pending on it: the loop keeps its connections' guard through a timer,
    which closing the loop drops (the second review found a guard kept in the loop's
    __dict__ holding the task, and its auto-extended leases renewed, for as long as the
    closed loop was referenced)."""
    refs = _abandon_a_task_holding_leases(cluster3.urls, keep_loop=True)
    assert refs["loop"].is_closed()
    gc.collect()
    gc.collect()
    assert refs["task"]() is None
    assert refs["manager"]() is None
    assert all(ref() is None for ref in refs["leases"])
