"""The one interface of both transports: what a manager calls to talk to its nodes.

:class:`Transport` (sync: :class:`~django_redlock.wire.sync.connections.ConnectionSet`, one
per thread) and :class:`AsyncTransport` (asyncio:
:class:`~django_redlock.wire.asyncio.connections.LoopConnections`, one per event loop) have
the same methods, with the same names, argument order, defaults and result types; only
``run`` and the subscriber's ``subscribe`` and ``wait`` are coroutines in the asyncio one. So
are their subscribers (:class:`WakeSubscriber`, :class:`AsyncWakeSubscriber`). ``tests/core/
test_transport.py`` fails if one drifts from the other.

The names:

- ``run(commands, timeout, yes_value, need, *, give_up=None, identify=False,
  queue_behind=False) -> Round``: one round trip, ``commands[i]`` to node ``i`` (``None``
  skips it), waited for up to ``timeout`` seconds (relative) or until the outcome is known
  (see :class:`~django_redlock.wire.rounds.Round`: ``need`` replies equal to ``yes_value``,
  or more than ``give_up`` others; default ``len(commands) - need``). ``identify``: each
  command is completed with its connection's identity (see
  :class:`~django_redlock.wire.setup.Hello`). ``queue_behind``: a node that owes many replies
  still gets the command, queued behind what it owes (see
  :meth:`~django_redlock.wire.stall.StallRule.room`), instead of being skipped: for a release,
  which a stalled node then applies when it catches up instead of keeping the key to its ttl.
- ``post(commands)``: send without waiting, queued behind what each node owes; the replies
  are read later and dropped (a NOSCRIPT still gets its EVAL fallback). For clean-ups: the
  release of a failed attempt, leaving a wait line. Never raises, never awaits (safe in a
  task being cancelled).
- ``open_count()``: the sockets open now; ``close()``: close them all (they reopen on use).
- ``subscriber``: the pub/sub side on which a waiting acquire hears of releases, with
  ``waiter_id()`` (a new id for one blocking acquire, registered at once: a release naming
  it is kept from then on), ``unregister(waiter)`` (its acquire is over; every id given must
  be unregistered), ``subscribe(key, timeout, waiter)`` (listen for releases of lock ``key``;
  True when it had to subscribe, so the caller tries once more), ``wait(waiter, timeout)``
  (True if a release named ``waiter`` since its last wait), ``open_count()`` and ``close()``.
"""

from __future__ import annotations

from typing import Protocol

from django_redlock.wire.rounds import Round
from django_redlock.wire.scripts import Commands

__all__ = ["AsyncTransport", "AsyncWakeSubscriber", "Transport", "WakeSubscriber"]


class WakeSubscriber(Protocol):
    """The sync transport's pub/sub side (see the module docstring)."""

    def waiter_id(self) -> str: ...

    def unregister(self, waiter: str) -> None: ...

    def subscribe(self, key: str, timeout: float, waiter: str = "") -> bool: ...

    def wait(self, waiter: str, timeout: float, need: int = 0, settle: float = 0.0) -> bool: ...

    def grants(self, waiter: str) -> dict[int, int]: ...

    def open_count(self) -> int: ...

    def close(self) -> None: ...


class AsyncWakeSubscriber(Protocol):
    """The asyncio transport's pub/sub side: :class:`WakeSubscriber` with coroutines."""

    def waiter_id(self) -> str: ...

    def unregister(self, waiter: str) -> None: ...

    async def subscribe(self, key: str, timeout: float, waiter: str = "") -> bool: ...

    async def wait(
        self, waiter: str, timeout: float, need: int = 0, settle: float = 0.0
    ) -> bool: ...

    def grants(self, waiter: str) -> dict[int, int]: ...

    def open_count(self) -> int: ...

    def close(self) -> None: ...


class Transport(Protocol):
    """The sync transport (see the module docstring)."""

    @property
    def subscriber(self) -> WakeSubscriber: ...

    def run(
        self,
        commands: Commands,
        timeout: float,
        yes_value: object,
        need: int,
        *,
        give_up: int | None = None,
        identify: bool = False,
        queue_behind: bool = False,
    ) -> Round: ...

    def post(self, commands: Commands) -> None: ...

    def open_count(self) -> int: ...

    def close(self) -> None: ...


class AsyncTransport(Protocol):
    """The asyncio transport: :class:`Transport` with ``run`` a coroutine."""

    @property
    def subscriber(self) -> AsyncWakeSubscriber: ...

    async def run(
        self,
        commands: Commands,
        timeout: float,
        yes_value: object,
        need: int,
        *,
        give_up: int | None = None,
        identify: bool = False,
        queue_behind: bool = False,
    ) -> Round: ...

    def post(self, commands: Commands) -> None: ...

    def open_count(self) -> int: ...

    def close(self) -> None: ...
