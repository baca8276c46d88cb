"""One background thread per process that renews every auto-extended lease.

A thread per lock would cost a thread per held lock; one scheduler thread with a heap of due
times renews them all, each at a third of its ttl (so two renewals can fail before the lease
runs out). Leases are held weakly: a lease dropped without release stops being renewed and
expires by itself. After ``fork()`` the child starts with no scheduled leases and no thread:
it owns nothing of the parent's.

A renewal is ``Lease.extend`` (``BaseLease.renew_once``): one that reaches no quorum leaves the
lease as valid as it was and is tried again, sooner as the validity left shrinks; the lease is
lost (the manager's observer hears of it) and renewal stops only when its validity runs out or
a quorum of nodes answers that it no longer holds it.
"""

from __future__ import annotations

import heapq
import itertools
import os
import threading
import time
import weakref
from typing import Protocol

from django_redlock.core.untracking import untrack
from django_redlock.wire.process import current_pid

__all__ = ["Renewable", "schedule"]


class Renewable(Protocol):
    """What the extender renews: a lease (``django_redlock.core.lease.BaseLease``)."""

    def renew_once(self) -> float | None:
        """Renew now; the ``time.monotonic()`` instant of the next renewal, or None to stop."""


class _Extender:
    def __init__(self) -> None:
        self.pid = current_pid()
        self.condition = threading.Condition()
        # (due, number) pairs, and the lease of each number: a tuple holding only a float and
        # an int is one the garbage collector stops tracking, where one holding the weak
        # reference would stay one more tracked object per auto-extended lease for every full
        # collection to visit (see test_lease_footprint.py).
        self.heap: list[tuple[float, int]] = []
        self.leases: dict[int, weakref.ref[Renewable]] = {}
        # Neither can be in a cycle (pairs of numbers; numbers and plain weak references,
        # which hold no strong reference), so neither need be tracked: a collection would
        # otherwise read every pair, number and weak reference in them, one more object or
        # three per auto-extended lease (see core.untracking). A list stays untracked.
        untrack(id(self.heap))
        self.counter = itertools.count()
        self.thread: threading.Thread | None = None

    def schedule(self, lease: Renewable, due: float) -> None:
        with self.condition:
            number = next(self.counter)
            # The plain weak reference, which CPython shares among all made to one object.
            self.leases[number] = weakref.ref(lease)
            # Again after each put: CPython before 3.14 tracks a dict again on any insert of
            # a weak reference (MAINTAIN_TRACKING in Objects/dictobject.c).
            untrack(id(self.leases))
            heapq.heappush(self.heap, (due, number))
            if self.thread is None:
                self.thread = threading.Thread(
                    target=self._run, name="django_redlock-extender", daemon=True
                )
                self.thread.start()
            self.condition.notify()

    def _run(self) -> None:
        while True:
            with self.condition:
                while True:
                    now = time.monotonic()
                    if self.heap and self.heap[0][0] <= now:
                        ref = self.leases.pop(heapq.heappop(self.heap)[1])
                        break
                    timeout = self.heap[0][0] - now if self.heap else None
                    self.condition.wait(timeout)
            lease = ref()
            if lease is not None:
                self._renew(lease)

    def _renew(self, lease: Renewable) -> None:
        due = lease.renew_once()
        if due is not None:
            self.schedule(lease, due)


_extender: _Extender | None = None
_lock = threading.Lock()


def _after_fork_in_child() -> None:
    """Start the child with no extender: the parent's thread does not exist here (only the
    forking thread survives a fork), its heap holds the parent's leases, and its locks may
    have been held by a parent thread at the instant of the fork, so they would never be
    released in the child. The child's first auto-extended lease starts a new thread."""
    global _extender, _lock
    _extender = None
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def schedule(lease: Renewable, due: float) -> None:
    """Renew ``lease`` at ``due`` (a ``time.monotonic()`` instant), then as it says."""
    global _extender
    with _lock:
        if _extender is None or _extender.pid != current_pid():
            _extender = _Extender()
        extender = _extender
    extender.schedule(lease, due)
