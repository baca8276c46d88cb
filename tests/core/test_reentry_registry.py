"""``Reentry``: the re-entry registry held weakly at less cost to the collector (issue 28,
item 4). A drop-in for the engine's ``weakref.WeakValueDictionary`` (``engine.held``): the
engine tests at the end put one in its place and re-enter, release and drop leases through it.
"""

from __future__ import annotations

import gc
import weakref

from django_redlock import LockManager
from django_redlock.core.lease import Reentry


class Value:
    """Stands for a lease: anything weakly referable."""


def test_get_set_delete_and_len():
    registry: Reentry[Value] = Reentry()
    a, b = Value(), Value()
    registry["a"] = a
    registry["b"] = b
    assert registry.get("a") is a
    assert registry.get("missing") is None
    assert len(registry) == 2
    del registry["a"]
    assert registry.get("a") is None
    assert len(registry) == 1
    registry["b"] = a  # replaced
    assert registry.get("b") is a


def test_a_dropped_value_is_gone_at_once_and_its_entry_swept():
    registry: Reentry[Value] = Reentry()
    value = Value()
    registry["k"] = value
    del value  # freed by reference counting: the registry does not keep it
    assert registry.get("k") is None
    assert len(registry) == 0
    assert not registry._data  # len swept the dead entry


def test_dead_entries_do_not_pile_up():
    registry: Reentry[Value] = Reentry()
    kept = [Value() for _ in range(10)]
    for i, value in enumerate(kept):
        registry[("kept", i)] = value
    for i in range(10_000):
        registry[("dropped", i)] = Value()  # dead as soon as it is put
    # Swept each time the dict doubled: never more than twice what lived at the last sweep.
    assert len(registry._data) <= 2 * Reentry._FIRST_SWEEP
    assert len(registry) == 10
    assert all(registry.get(("kept", i)) is value for i, value in enumerate(kept))


def test_a_sweep_leaves_a_live_value_put_under_a_dead_entrys_key():
    registry: Reentry[Value] = Reentry()
    registry["k"] = Value()  # dead at once
    live = Value()
    registry["k"] = live
    registry._sweep()
    assert registry.get("k") is live


def test_an_entry_is_one_plain_weak_reference_with_nothing_to_visit():
    registry: Reentry[Value] = Reentry()
    value = Value()
    registry["k"] = value
    ref = registry._data["k"]
    assert type(ref) is weakref.ref
    assert gc.get_referents(ref) == []  # no callback, no key, no class to visit
    # The one CPython shares among the plain weak references to an object (the extender's).
    assert ref is weakref.ref(value)
    # What the engine used before: a KeyedRef, whose key, callback and class a collection visits.
    old: weakref.WeakValueDictionary[str, Value] = weakref.WeakValueDictionary()
    old["k"] = value
    assert len(gc.get_referents(old.data["k"])) == 3  # type: ignore[attr-defined]


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
