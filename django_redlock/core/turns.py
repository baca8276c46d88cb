"""One at a time on an auto-extended lease: the extender's renewal or its owner's call.

An auto-extended lease is renewed by the process's extender thread (``core/extender.py``)
while its owner may extend or release it, or set its names or fencing token: these must not
overlap. A renewal racing a release would find the keys gone and call the lease lost; two
renewals, or a renewal and a setter, would each replace the lease's state tuple and one
update would be lost.

Each such lease used to carry a ``threading.Lock`` of its own for that. A lock is one more
object per held lease for every full collection of the garbage collector to read, one likely
cache miss each: at 50,000 held auto-extended leases, a third of what a collection read of
them (issue 28: a collection's pause grew by 10-12 ms where a plain lease's grew by 7-8). So
the lease's ``_guard`` slot holds a flag instead, ``False`` (free) or ``True`` (taken): two
objects every lease shares. It is flipped under one process-wide condition that is held for
the flip only, never across a round trip to the nodes, so a lease never waits for another's
round: only for its own, as with a lock of its own. A lease that is not auto-extended has
``None`` there and is never taken (only its owner changes it).

A turn is not re-entrant, as the lock was not: a thread that takes a lease's turn and, in
it, asks for the same lease's turn again waits for ever (nothing here does).

After ``fork()`` the child gets a new condition: a thread of the parent may have held the old
one at that instant, and no thread of the child would ever give it back. A flag copied as
``True`` belongs to an inherited lease, which refuses every call before it asks for a turn
(``BaseLease._refuse_inherited``).
"""

from __future__ import annotations

import os
import threading
from typing import Protocol

__all__ = ["Guarded", "give_back", "is_taken", "take", "try_take"]


class Guarded(Protocol):
    """A lease: ``_guard`` is None (not auto-extended), False (free) or True (taken)."""

    _guard: bool | None


_condition = threading.Condition(threading.Lock())


def _after_fork_in_child() -> None:
    global _condition
    _condition = threading.Condition(threading.Lock())


os.register_at_fork(after_in_child=_after_fork_in_child)


def take(lease: Guarded) -> None:
    """Wait until ``lease``'s turn is free, then take it (blocking: threads only, never an
    event loop; see ``try_take``). Give it back with ``give_back``, in a ``finally``."""
    condition = _condition
    with condition:
        while lease._guard:
            condition.wait()
        lease._guard = True


def try_take(lease: Guarded) -> bool:
    """Take ``lease``'s turn if it is free, at once: True when taken. For an event loop,
    which polls (``core/amanager.py``: a task cancelled while it waits then owns nothing)."""
    with _condition:
        if lease._guard:
            return False
        lease._guard = True
        return True


def give_back(lease: Guarded) -> None:
    """End the turn taken on ``lease`` and wake whoever waits for a turn (each checks its
    own lease's flag again: one condition serves every lease, and waiting is rare, a call
    overlapping a renewal of the same lease)."""
    condition = _condition
    with condition:
        lease._guard = False
        condition.notify_all()


def is_taken(lease: Guarded) -> bool:
    """True while someone has ``lease``'s turn (a renewal or call in flight)."""
    return lease._guard is True
