"""Objects the garbage collector need not track: CPython's ``PyObject_GC_UnTrack``.

A full collection visits every object the collector tracks, and every reference in each: a
process holding tens of thousands of leases paid for each one's objects in every collection
(issue 28). An object that holds no reference that could close a cycle (a plain weak
reference, a lock, a container of numbers, strings and such objects) gives the collector
nothing to find, and untracked it works as before: it is freed by reference counting, as
untracked tuples and dicts are. Objects it refers to that the collector does track look
referenced from outside to the collector, which they are.

Used by ``core.lease`` (the re-entry registry's weak references, a thread's or a task's
dict of them, and the leases of a thread or task holding many, tracked again by
:data:`track` when released) and
``core.extender`` (its heap and its map of leases). Where the calls cannot be had (another
Python, no ``ctypes``), :data:`untrack` and :data:`track` do nothing (nothing was untracked).
"""

from __future__ import annotations

import sys
from collections.abc import Callable


def _gc_call(symbol: str) -> Callable[[int], None] | None:
    """CPython's C function ``symbol`` taking one object (``PyObject_GC_UnTrack`` or
    ``PyObject_GC_Track``), called with an object's ``id()``, or None where it cannot be had
    (another Python, no ctypes). Called through a ``PYFUNCTYPE`` prototype, which keeps the
    GIL (the collector's lists need it)."""
    if sys.implementation.name != "cpython":
        return None
    try:
        import ctypes

        prototype = ctypes.PYFUNCTYPE(None, ctypes.c_void_p)
        call: Callable[[int], None] = prototype((symbol, ctypes.pythonapi))
    except (ImportError, AttributeError, OSError):  # pragma: no cover - no ctypes, no symbol
        return None
    return call


def _gc_untracker() -> Callable[[int], None] | None:
    """CPython's ``PyObject_GC_UnTrack``, called with an object's ``id()``, or None where it
    cannot be had (another Python, no ctypes).

    Used on objects holding no reference that could close a cycle (see the module's
    docstring for which). CPython makes every weak reference an object the collector tracks
    (``weakref.ref`` is a GC type, tracked as it is made), so each held lease cost a full
    collection two tracked objects, each walked in every pass over its list. A plain weak
    reference (no callback: the one CPython shares among all made to an object) holds no
    strong reference to anything (its referent is borrowed, and its only traversed field is
    the absent callback), so it can be in no reference cycle, and the collector has nothing
    to find in it: untracked, it still works as before (cleared in C when its referent
    goes), as untracked tuples and dicts do. ``PyObject_GC_UnTrack`` is the public C API
    for this, and does nothing to an object not tracked.
    """
    return _gc_call("PyObject_GC_UnTrack")


def keep_tracked(address: int) -> None:
    """Where ``PyObject_GC_UnTrack`` cannot be had: everything stays tracked."""


# Called with an object's id(): the object must be alive, and must hold no reference that
# could close a cycle.
untrack: Callable[[int], None] = _gc_untracker() or keep_tracked

# Called with an object's id(): the object must be alive, of a GC type, and NOT tracked
# (CPython's PyObject_GC_Track aborts the process on an object already tracked: check with
# gc.is_tracked first). Only where untrack is CPython's: else nothing was untracked.
track: Callable[[int], None] = (
    (_gc_call("PyObject_GC_Track") or keep_tracked) if untrack is not keep_tracked else keep_tracked
)
