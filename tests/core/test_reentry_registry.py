"""``Reentry``: the re-entry registry held weakly at less cost to the collector (issue 28,
item 4). A drop-in for the engine's ``weakref.WeakValueDictionary`` (``engine.held``): the
engine tests at the end put one in its place and re-enter, release and drop leases through it.
"""

from __future__ import annotations

import asyncio
import gc
import os
import threading
import weakref

import pytest

from django_redlock import LockManager
from django_redlock.core import untracking
from django_redlock.core.owner import owner_scope
from django_redlock.core.reentry import Reentry
from django_redlock.core.untracking import UNTRACK_AT


class Value:
    """Stands for a lease: anything weakly referable."""


def scope_of_this_thread() -> tuple[object, ...]:
    return (os.getpid(), threading.get_ident(), None)


HERE = scope_of_this_thread()


def test_get_put_remove_and_len():
    registry: Reentry[Value] = Reentry()
    a, b = Value(), Value()
    registry.put(HERE, "a", a)
    registry.put(HERE, "b", b)
    assert registry.get(HERE, "a") is a
    assert registry.get(HERE, "missing") is None
    assert registry.get((0, 0, None), "a") is None  # another scope
    assert len(registry) == 2
    registry.remove(HERE, "a", b)  # not b's entry: kept
    assert registry.get(HERE, "a") is a
    registry.remove(HERE, "a", a)
    assert registry.get(HERE, "a") is None
    assert len(registry) == 1
    registry.put(HERE, "b", a)  # replaced
    assert registry.get(HERE, "b") is a
    registry.remove(HERE, "b", a)
    assert not registry  # the scope's empty dict went with its last entry


def test_a_dropped_value_is_gone_at_once_and_its_entry_swept():
    registry: Reentry[Value] = Reentry()
    value = Value()
    registry.put(HERE, "k", value)
    del value  # freed by reference counting: the registry does not keep it
    assert registry.get(HERE, "k") is None
    assert len(registry) == 0
    assert not registry._scopes  # len swept the dead entry, and this thread's empty dict


def test_dead_entries_do_not_pile_up():
    registry: Reentry[Value] = Reentry()
    kept = [Value() for _ in range(10)]
    for i, value in enumerate(kept):
        registry.put(HERE, f"kept-{i}", value)
    for i in range(10_000):
        registry.put(HERE, f"dropped-{i}", Value())  # dead as soon as it is put
    # Swept each time the dict doubled: never more than twice what lived at the last sweep.
    assert len(registry._scopes[HERE]) <= 2 * Reentry._FIRST_SWEEP
    assert len(registry) == 10
    assert all(registry.get(HERE, f"kept-{i}") is value for i, value in enumerate(kept))


def test_a_sweep_leaves_a_live_value_put_under_a_dead_entrys_key():
    registry: Reentry[Value] = Reentry()
    registry.put(HERE, "k", Value())  # dead at once
    live = Value()
    registry.put(HERE, "k", live)
    registry._sweep()
    assert registry.get(HERE, "k") is live


def test_an_entry_is_one_plain_weak_reference_with_nothing_to_visit():
    registry: Reentry[Value] = Reentry()
    value = Value()
    registry.put(HERE, "k", value)
    entries = registry._scopes[HERE]
    ref = entries["k"]
    assert type(ref) is weakref.ref
    assert gc.get_referents(ref) == []  # no callback, no key, no class to visit
    # The one CPython shares among the plain weak references to an object (the extender's).
    assert ref is weakref.ref(value)
    # Keyed by the name alone, in the scope's own dict: a collection visits the values of
    # a dict with only str keys, not its keys (no (scope, name) tuple per entry).
    assert [type(key) for key in entries] == [str]
    assert ref in gc.get_referents(entries)
    assert "k" not in gc.get_referents(entries)
    # What the engine used before: a KeyedRef, whose key, callback and class a collection visits.
    old: weakref.WeakValueDictionary[str, Value] = weakref.WeakValueDictionary()
    old["k"] = value
    assert len(gc.get_referents(old.data["k"])) == 3  # type: ignore[attr-defined]


def test_a_scope_holding_many_keeps_weak_references_the_collector_does_not_track():
    """Beyond a few entries per scope, the registry's weak reference to each value is one
    the collector does not track (a held lease is then one tracked object, itself); it
    works as a tracked one does."""
    assert untracking.untrack is not untracking.keep_tracked  # CPython: PyObject_GC_UnTrack found
    registry: Reentry[Value] = Reentry()
    values = [Value() for _ in range(4 * UNTRACK_AT)]
    for i, value in enumerate(values):
        registry.put(HERE, f"k{i}", value)
    entries = registry._scopes[HERE]
    untracked = [name for name, ref in entries.items() if not gc.is_tracked(ref)]
    assert len(untracked) >= len(values) - UNTRACK_AT
    assert all(registry.get(HERE, f"k{i}") is value for i, value in enumerate(values))
    # Dropped: cleared at once, as a tracked one is.
    del value
    values.pop()
    assert registry.get(HERE, f"k{len(values)}") is None
    assert gc.get_referents(entries[untracked[0]]) == []  # nothing to find in it


def test_untracked_weak_references_to_cyclic_garbage_are_cleared_by_the_collector():
    """A value freed only by the collector (it is in a reference cycle): the collector
    clears the weak references to it, untracked ones too, as it frees it."""
    registry: Reentry[Value] = Reentry()
    values = [Value() for _ in range(4 * UNTRACK_AT)]
    for i, value in enumerate(values):
        value.cycle = value  # type: ignore[attr-defined]
        registry.put(HERE, f"c{i}", value)
    entries = registry._scopes[HERE]
    refs = list(entries.values())
    assert not gc.is_tracked(refs[-1])
    assert not gc.is_tracked(entries)  # a thread's scope: its dict is not tracked either
    del value, values
    gc.collect()
    assert all(ref() is None for ref in refs)
    assert all(registry.get(HERE, f"c{i}") is None for i in range(len(refs)))
    assert len(registry) == 0


def test_a_thread_scope_holding_many_is_a_dict_the_collector_does_not_track():
    """Past a few entries, a thread's dict of entries holds only names and untracked plain
    weak references (and its scope tuple of numbers): it can be in no reference cycle, so
    the collector does not track it, and a full collection reads none of the weak
    references in it. It stays so whatever is done to it, and works as before."""
    registry: Reentry[Value] = Reentry()
    held: dict[str, Value] = {}

    def put(name: str) -> None:
        held[name] = Value()
        registry.put(HERE, name, held[name])

    for i in range(UNTRACK_AT - 1):
        put(f"k{i}")
    entries = registry._scopes[HERE]
    assert gc.is_tracked(entries)  # a few entries: as any dict (no call on their puts)
    put("crossing")
    assert len(entries) == UNTRACK_AT

    def check() -> None:
        assert not gc.is_tracked(entries)
        # The weak references put below the threshold too: nothing in it is tracked.
        assert not any(gc.is_tracked(ref) for ref in entries.values())
        assert all(registry.get(HERE, name) is value for name, value in held.items())

    check()
    for i in range(3 * UNTRACK_AT):  # more puts
        put(f"more-{i}")
        check()
    put("k0")  # a put of a name already there
    check()
    for name in ("k1", "k2"):  # removes
        registry.remove(HERE, name, held.pop(name))
        assert registry.get(HERE, name) is None
        check()
    registry.remove(HERE, "k3", Value())  # not its value: kept
    check()
    # Dropped without release: swept as the dict doubles, and by len.
    sweeps = entries.sweep_at
    for i in range(2 * entries.sweep_at):
        registry.put(HERE, f"dropped-{i}", Value())
        check()
    assert len(entries) < len(held) + 2 * sweeps  # swept meanwhile
    assert len(registry) == len(held)
    check()
    # Below the threshold again (every put there makes it tracked again, but for 3.14's
    # dicts, which stay untracked: either way safe), then past it again.
    for name in list(held)[2:]:
        registry.remove(HERE, name, held.pop(name))
    for i in range(UNTRACK_AT):
        put(f"again-{i}")
    check()
    # A value dropped: freed at once by reference counting, its entry reads None.
    del held["again-0"]
    assert registry.get(HERE, "again-0") is None
    assert len(registry) == len(held)
    check()


def test_an_asyncio_scopes_dict_is_untracked_as_a_threads_is():
    """An asyncio task's scope holds the task weakly (owner_scope), so its dict of many weak
    references is one the collector need not track, as a thread's: it can be in no cycle."""
    registry: Reentry[Value] = Reentry()
    values = [Value() for _ in range(4 * UNTRACK_AT)]
    states: list[bool] = []
    scopes: list[tuple[object, ...]] = []

    async def hold() -> None:
        scope = owner_scope()
        scopes.append(scope)
        for i, value in enumerate(values):
            registry.put(scope, f"k{i}", value)
            states.append(gc.is_tracked(registry._scopes[scope]))
        assert all(registry.get(owner_scope(), f"k{i}") is value for i, value in enumerate(values))

    asyncio.run(hold())
    assert type(scopes[0][2]) is weakref.ref
    assert all(states[: UNTRACK_AT - 1])
    assert not any(states[UNTRACK_AT - 1 :])


def test_a_scope_holding_its_task_keeps_its_dict_tracked():
    """A task that cannot be weakly referenced is held by its scope (owner_scope): the dict
    holding that tuple stays one the collector tracks, or the task (and what it reaches)
    would look referenced from outside, and a cycle through it could never be collected."""
    registry: Reentry[Value] = Reentry()
    values = [Value() for _ in range(4 * UNTRACK_AT)]
    states: list[bool] = []

    async def hold() -> None:
        scope = (os.getpid(), threading.get_ident(), asyncio.current_task())
        for i, value in enumerate(values):
            registry.put(scope, f"k{i}", value)
            states.append(gc.is_tracked(registry._scopes[scope]))

    asyncio.run(hold())
    assert all(states)


def test_the_scope_tuple_is_the_registrys_one():
    """Values registered under equal scopes get one scope tuple back, the first put's: an
    asyncio task's scope is a new tuple at each acquire (it holds a weak reference to the
    task, so the collector tracks it), and its leases keep the registry's instead (one per
    task, not per lease)."""
    registry: Reentry[Value] = Reentry()
    first, second = Value(), Value()
    scope = (os.getpid(), threading.get_ident(), Value())
    again = tuple(scope)
    assert again == scope
    assert registry.put(scope, "a", first) is scope
    assert registry.put(again, "b", second) is scope


def test_a_sweep_as_scopes_pile_up_keeps_the_entry_being_put():
    """The registry sweeps as it gains scopes (a dict per thread, per task): the sweep that
    a new scope's put sets off must not drop that scope's dict, still empty or not."""
    registry: Reentry[Value] = Reentry()
    values = [Value() for _ in range(3 * Reentry._FIRST_SWEEP)]
    for pid, value in enumerate(values):
        # Scopes of this thread (as after forks: one per pid), which its sweeps may drop
        # once empty.
        registry.put((pid, threading.get_ident(), None), "k", value)
    assert all(
        registry.get((pid, threading.get_ident(), None), "k") is value
        for pid, value in enumerate(values)
    )
    assert len(registry) == len(values)


def test_another_threads_release_leaves_the_scope_to_its_thread():
    """A scope's dict is removed once empty only by its own thread, the one that puts under
    it: a release from another thread racing that thread's put must not drop the entry."""
    registry: Reentry[Value] = Reentry()
    value, other = Value(), Value()
    registry.put(HERE, "a", value)
    done = threading.Event()

    def release_elsewhere() -> None:
        registry.remove(HERE, "a", value)
        registry._sweep()
        done.set()

    threading.Thread(target=release_elsewhere).start()
    assert done.wait(10)
    assert HERE in registry._scopes  # left for this thread, empty
    registry.put(HERE, "b", other)
    assert registry.get(HERE, "b") is other
    registry.remove(HERE, "b", other)
    assert not registry._scopes


@pytest.mark.parametrize("weakly", [True, False], ids=["task-gone", "task-done"])
def test_a_done_tasks_empty_scope_is_swept(weakly: bool):
    """Whether the scope holds its task weakly (owner_scope; once the task is gone) or
    strongly (a task that cannot be weakly referenced; done)."""
    registry: Reentry[Value] = Reentry()
    values = [Value()]

    async def hold() -> tuple[object, ...]:
        task = asyncio.current_task()
        scope = owner_scope() if weakly else (os.getpid(), threading.get_ident(), task)
        registry.put(scope, "a", values[0])
        return scope

    scope = asyncio.run(hold())
    values.clear()  # dropped without release, by a task now done
    if weakly:
        gc.collect()
        assert scope[2]() is None  # type: ignore[operator]
    assert scope in registry._scopes
    assert len(registry) == 0
    assert scope not in registry._scopes  # the task is not kept by the registry


def test_the_engine_reenters_releases_and_forgets_leases_through_it(cluster3):
    manager = LockManager(cluster3.urls)
    assert type(manager.engine.held) is Reentry  # the engine's own registry is this one
    with manager.lock("reentry", ttl=10.0) as outer:
        with manager.lock("reentry", ttl=10.0) as inner:
            assert inner is outer
            assert outer.depth == 2
        assert outer.depth == 1
        assert len(manager.engine.held) == 1
    assert outer.released
    assert len(manager.engine.held) == 0
    # Re-acquired after the release: a new lease, not the released one.
    again = manager.acquire("reentry", ttl=10.0)
    assert again is not outer
    gone = weakref.ref(again)
    del again  # dropped without release: freed at once, its keys run out by their ttl
    assert gone() is None
    assert len(manager.engine.held) == 0
    fresh = manager.acquire("reentry-2", ttl=10.0)
    assert manager.acquire("reentry-2", ttl=10.0) is fresh
    fresh.release()
    fresh.release()
