"""The locks beyond a mutex as users hold them: :class:`Semaphore` and :class:`RWLock`.

Small handles made by a manager (``m.semaphore(name, limit)``, ``m.rwlock(name)``, sync or
asyncio); each acquire goes through the manager's Redlock rounds with a shape of its own
(``procedures/shapes.py``), under the same quorum, validity, retry and restart rules as
``acquire``. With a sync manager they return a :class:`~django_redlock.redlock.Lease`; with
an asyncio one, a coroutine of an :class:`~django_redlock.aredlock.AsyncLease`. Either lease
is a context manager (``with`` / ``async with``) and renews, releases and is lost like a
lock's; they are not re-entrant (each acquire is a lease of its own) and cannot be handed off.
"""

from __future__ import annotations

from typing import Any, Generic, Protocol, TypeVar, Unpack

from django_redlock.procedures.options import AcquireOptions
from django_redlock.procedures.shapes import ReadWrite, Shape, Slots
from django_redlock.wire.primitives import Mode, check_limit

__all__ = ["RWLock", "Semaphore", "Taker"]

_R = TypeVar("_R", covariant=True)


class Taker(Protocol[_R]):
    """What a handle needs of its manager: acquire a lease of a shape, with the arguments
    of ``acquire`` (``LockManager.acquire_shape``, ``AsyncLockManager.acquire_shape``)."""

    @property
    def key_prefix(self) -> str: ...

    @property
    def addresses(self) -> tuple[Any, ...]: ...

    def acquire_shape(self, name: str, shape: Shape, **options: Unpack[AcquireOptions]) -> _R: ...


class Semaphore(Generic[_R]):
    """At most ``limit`` valid leases at any moment, cluster-wide: ``acquire()`` takes one
    of the ``limit`` slots (each a Redlock mutex of its own), waiting in a fair FIFO line
    when all are taken.

    Example: at most 3 concurrent calls to a rate-limited API from every worker::

        api = manager.semaphore("partner-api", 3)
        with api.acquire(timeout=30, auto_extend=True):
            call_partner_api()

    Attributes:
        name: the semaphore's name; ``limit``: its number of slots.
    """

    def __init__(self, manager: Taker[_R], name: str, limit: int) -> None:
        self._manager = manager
        self.name = name
        self.limit = check_limit(limit)

    def __repr__(self) -> str:
        return f"<Semaphore {self.name!r} limit {self.limit}>"

    def acquire(self, **options: Unpack[AcquireOptions]) -> _R:
        """Take one slot: a lease (or, asyncio, a coroutine of one). Takes the arguments of
        ``acquire`` (ttl, blocking, timeout, auto_extend, max_hold, origin) and raises what
        it raises (``LockContended`` when every slot stays taken).
        """
        manager = self._manager
        shape = Slots(manager.key_prefix + self.name, self.limit, len(manager.addresses))
        return manager.acquire_shape(self.name, shape, **options)


class RWLock(Generic[_R]):
    """A read-write lock: many readers or one writer, over the quorum. A waiting writer
    holds back the readers that come after it (no writer starvation), and the line is fair
    (one ticket per waiter on every node). The write lease is the lock of the same name: a
    writer and ``acquire(name)`` exclude each other, and readers exclude both.

    Example::

        table = manager.rwlock("price-table")
        with table.read(timeout=5):
            prices = load_prices()
        with table.write(timeout=5):
            rebuild_prices()
    """

    def __init__(self, manager: Taker[_R], name: str) -> None:
        self._manager = manager
        self.name = name

    def __repr__(self) -> str:
        return f"<RWLock {self.name!r}>"

    def read(self, **options: Unpack[AcquireOptions]) -> _R:
        """Take a read (shared) lease; the arguments and errors of ``acquire``."""
        return self._take("r", options)

    def write(self, **options: Unpack[AcquireOptions]) -> _R:
        """Take the write (exclusive) lease; the arguments and errors of ``acquire``."""
        return self._take("w", options)

    def _take(self, mode: Mode, options: AcquireOptions) -> _R:
        manager = self._manager
        shape = ReadWrite(manager.key_prefix + self.name, mode)
        return manager.acquire_shape(self.name, shape, **options)
