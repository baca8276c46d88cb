"""Objects the garbage collector need not track: CPython's ``PyObject_GC_UnTrack``.

A full collection visits every object the collector tracks, and every reference in each: a
process holding tens of thousands of leases paid for each one's objects in every collection
(issue 28). An object that holds no reference that could close a cycle (a plain weak
reference, a lock, a container of numbers, strings and such objects) gives the collector
nothing to find, and untracked it works as before: it is freed by reference counting, as
untracked tuples and dicts are. Objects it refers to that the collector does track look
referenced from outside to the collector, which they are.

The switch is here, in one place: :data:`UNTRACK_AT` (from how many leases a scope holds its
weak references, its dict and its leases untracked; never where the calls cannot be had) and
:data:`LEASES_UNTRACKED` (whether leases themselves are). Used by ``core.reentry`` (the
re-entry registry's weak references, a thread's or a task's dict of them, and the leases of a
thread or task holding many), ``core.lease`` (:func:`track_again`, when a hold ends) and
``core.extender`` (its heap and its map of leases). Where the calls cannot be had (another
Python, no ``ctypes``), :data:`untrack` and :data:`track` do nothing (nothing was untracked).
"""

from __future__ import annotations

import gc
import os
import sys
import threading
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


# -- the switch ---------------------------------------------------------------------------

# A scope holding fewer leases than this keeps its weak references tracked: a few tracked
# objects more do not show in a collection, and the untracking call (about 0.15 us, through
# ctypes) would be on every acquire's path (a thread's first hold makes its scope's dict:
# no check there either). From here on, the weak reference of every lease its scope puts
# is untracked: a held lease is one object the collector tracks, itself; and a thread's
# dict of them is untracked too (see core.reentry), so that a collection reads no weak
# reference either (a second call on each such put: each insert tracks the dict again).
# (Many scopes holding a lease or two each, asyncio tasks, keep theirs tracked.)
UNTRACK_AT = 16 if untrack is not keep_tracked else sys.maxsize

# From there on, a scope untracks the lease itself too, when nothing it refers to can
# refer back to it (see core.lease.cycle_free): its lease class says so, and its manager's
# observer keeps no lease. Then a collection does not read the lease, nor its state through it: a
# held lease costs a collection only the reference to it that its holder keeps (issue 28,
# item 4). It is tracked again as its hold ends (let_go, before it leaves the registry):
# released, handed off or let go, a lease may be kept by anything, an observer among them.
# Only where both calls can be had: a lease untracked for good could hide a cycle for ever.
LEASES_UNTRACKED = track is not keep_tracked
_is_tracked = gc.is_tracked
# Held only across the check and the call that tracks a lease again: PyObject_GC_Track
# aborts the process on an object already tracked, and two threads releasing one lease at
# once (a misuse the second release reports) would both find it untracked. Re-entrant: a
# signal handler, or a finalizer run by a collection (3.12+ runs them between bytecodes),
# may release a lease on this thread while it holds the lock; _being_tracked (the leases
# this thread is tracking again, read and changed only under the lock) keeps such a handler
# from tracking the very lease the interrupted call is about to track.
_tracking = threading.RLock()
_being_tracked: list[object] = []


def _tracking_after_fork_in_child() -> None:
    """A parent thread may hold the lock at the fork: the child makes its own."""
    global _tracking, _being_tracked
    _tracking = threading.RLock()
    _being_tracked = []


def track_again(lease: object) -> None:
    """Have the collector track ``lease`` again if the registry untracked it (see
    LEASES_UNTRACKED): by :func:`core.lease.let_go`, before the hold ends."""
    if not _is_tracked(lease):
        with _tracking:
            if any(other is lease for other in _being_tracked):
                return  # re-entered (a signal handler's release): the outer call tracks it
            _being_tracked.append(lease)
            try:
                if not _is_tracked(lease):
                    track(id(lease))
            finally:
                _being_tracked.pop()


os.register_at_fork(after_in_child=_tracking_after_fork_in_child)
