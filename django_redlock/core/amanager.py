"""The asyncio manager: :class:`AsyncLockManager` hands out :class:`AsyncLease` objects
(public import path ``django_redlock.aredlock``).

It holds the same engine as :class:`~django_redlock.redlock.LockManager`
(``django_redlock.core.engine``: configuration, re-entry registry, observer;
``AsyncLockManager.sharing(sync)`` shares one), does what that manager does alike through
their common base (``core.configured``), runs the same procedures
(``django_redlock.procedures``), and reports the same way; only the driver differs: the
asyncio one (``django_redlock.wire.asyncio``: its driver and connections), per event loop, with no
thread hop per call. It imports nothing of the sync manager's module.

Renewal of ``auto_extend`` leases runs on the process's extender thread (one per process),
as a sync round on the engine's sync transport. The operator calls that read every node
through their own clients (``locks``, ``declare_fresh``) stay plain functions, as do the
ones that do no I/O; ``locked``, ``holder`` and ``force_release`` are coroutines.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Generator, Iterable
from functools import partial
from types import TracebackType
from typing import Any, NoReturn, TypeVar, Unpack

from django_redlock.core import turns
from django_redlock.core.configured import EngineConfigured
from django_redlock.core.engine import (
    Engine,
)
from django_redlock.core.handle import LeaseHandle
from django_redlock.core.lease import TAKER_PID, BaseLease, release_round, settle_release
from django_redlock.exceptions import LeaseReleased, LockLost
from django_redlock.procedures import flow
from django_redlock.procedures.effects import Effect, Round
from django_redlock.procedures.lease import extend, owned
from django_redlock.procedures.operators import force_release, holder
from django_redlock.procedures.options import (
    MANAGER_DEFAULT,
    AcquireOptions,
    ManagerDefault,
    acquire_options,
)
from django_redlock.procedures.shapes import Shape
from django_redlock.wire import process
from django_redlock.wire.asyncio.connections import LoopConnections, PerLoop, keep_with_loop
from django_redlock.wire.asyncio.driver import drive, finish_round, retrieve
from django_redlock.wire.rounds import Round as RoundState
from django_redlock.wire.stall import MAX_OUTSTANDING, stall_limits

__all__ = ["AsyncLease", "AsyncLockManager"]

_R = TypeVar("_R")


async def _take(lease: turns.Guarded) -> None:
    """Take the turn of ``lease`` (auto-extended: shared with the extender thread; see
    ``core.turns``) without blocking the event loop, and so that a cancelled task never ends
    up owning it.

    It is polled, never waited for in a worker thread: such a thread goes on waiting after
    its task is cancelled, takes the turn, and no one gives it back; the extender thread,
    which renews every auto-extended lease of the process, then blocks on it for good and
    all those leases expire. The extender holds the turn for one renewal round trip at most
    (bounded by the node timeout), so the polls are few and short.
    """
    delay = 0.0005
    while not turns.try_take(lease):
        await asyncio.sleep(delay)
        delay = min(2 * delay, 0.02)


# What AsyncLockManager._on_engine made, by id(engine), weakly: held strongly, a manager would
# keep its engine and the loops it reached alive for good.
_ORPHANS: weakref.WeakValueDictionary[int, AsyncLockManager] = weakref.WeakValueDictionary()


def settle_exchange(lease: BaseLease, exchange: RoundState, expired: bool) -> None:
    """Judge a release round's outcome (``core.lease.settle_release``).

    Raises:
        LockLost: the lease had expired, or a quorum no longer held it.
    """
    settle_release(lease, exchange.results, exchange.yes, expired)


class AsyncLease(BaseLease):
    """A held lock from :class:`AsyncLockManager`: ``await lease.extend()``,
    ``await lease.release()``, or ``async with``; ``name``, ``validity``, ``lost``,
    ``fencing_token`` and ``check()`` as for :class:`~django_redlock.Lease` (see
    :class:`~django_redlock.core.lease.BaseLease`).

    Its own type, not a :class:`~django_redlock.Lease`: its ``extend``/``release`` are
    coroutines, so it is never where code expects a lease that a plain ``with`` releases.
    A plain ``with`` raises ``TypeError``.

    Cancellation: a task cancelled in ``release()`` still releases (the release is shielded
    and finishes in the background); one cancelled in ``extend()`` leaves the lease as it
    was, held until its current validity runs out (or renewed by auto-extension).
    """

    # Its asyncio manager, weakly: that manager's per-loop connections hold the futures that
    # tasks wait on (and their loop the tasks), and a task's frame may hold this lease, so a
    # strong reference would make a cycle through every lease a task holds. With it weak, an
    # asyncio lease refers to what a sync one does (core.lease's _cycle_free), and a task
    # holding many has them untracked by the collector as a thread does (issue 28, item 4).
    __slots__ = ("_manager",)
    _cycle_free_class = True
    _host: Engine

    def __init__(self, manager: AsyncLockManager, *fields: Any, **named: Any) -> None:
        # Hosted by the engine, as a sync lease (clock, reporter, and the extender's
        # renewals, which are sync rounds); its own rounds are the asyncio manager's.
        super().__init__(manager, *fields, **named)
        self._manager = weakref.ref(manager)  # one per manager: CPython shares it

    @property
    def _async_manager(self) -> AsyncLockManager:
        """The asyncio manager that took the lease; if it is gone (dropped, once the loops
        that used it ended: its connections' guard, which each such loop keeps, keeps it
        until then), a stand-in on the same engine, whose connections to this loop open on
        demand."""
        manager = self._manager()
        if manager is None:
            manager = AsyncLockManager._on_engine(self._host)
            self._manager = weakref.ref(manager)  # for its later calls too
        return manager

    async def owned(self) -> bool:
        """Ask the nodes (one round trip) whether a quorum still holds this lease (see
        :meth:`Lease.owned <django_redlock.Lease.owned>`).

        Raises:
            LeaseInherited: called in a process forked from the lease's owner.
        """
        self._refuse_inherited()
        if self._released or self.validity <= 0:
            return False
        return await self._async_manager._owned(self)

    async def extend(self) -> float:
        """Renew the lease to its full ttl on a quorum; the new validity in seconds (see
        :meth:`Lease.extend <django_redlock.Lease.extend>`).

        Raises:
            LeaseReleased: the lease was released.
            LockLost: the lease had ended (its validity ran out, or a quorum of nodes no
                longer holds it); it is now lost and its keys are freed (for a lease found
                gone, only those this renewal set again: see ``procedures/flow.lost_clean_up``).
            LeaseNotExtended: no quorum either way: the lease keeps its validity and keys.
            LeaseInherited: called in a forked child; nothing is sent to the nodes.
        """
        # Before the turn, as Lease.extend: a child forked while the extender renewed the
        # lease has a copy of it taken that nobody will ever give back (core.turns).
        self._refuse_inherited()
        if self._guard is None:
            self.check()
            return await self._async_manager._extend(self)
        await _take(self)  # one renewal at a time, the extender's or ours
        try:
            self.check()
            return await self._async_manager._extend(self)
        finally:
            turns.give_back(self)

    async def release(self) -> None:
        """Delete the lock on every node where it still holds this lease's token (see
        :meth:`Lease.release <django_redlock.Lease.release>`). Shielded from cancellation:
        once called, the release is carried out even if the calling task is cancelled.

        Raises:
            LeaseInherited: called in a process forked from the lease's owner.
            LeaseReleased: called twice.
            LockLost: the lease had expired, or a quorum no longer held it.
        """
        if self._state[TAKER_PID] != process.PID:  # a forked child: no call in the usual case
            self._refuse_inherited()
        if not self._end_hold():
            return
        if self._guard is None:
            # No renewal can be in flight: the round goes out from this task, which is
            # cancellation safe by itself (see AsyncLockManager._release): no task and no
            # shield, whose wake-ups cost a pair three turns of the event loop.
            await self._async_manager._release(self)
            return
        finishing = asyncio.ensure_future(self._finish_release())
        try:
            await asyncio.shield(finishing)
        except asyncio.CancelledError:
            finishing.add_done_callback(retrieve)
            raise

    async def _finish_release(self) -> None:
        if self._guard is not None:
            # Wait out a renewal in flight, so it does not find the keys gone and call the
            # lease lost; none starts after it (the lease is marked released).
            await _take(self)
            turns.give_back(self)
        await self._async_manager._release(self)

    async def __aenter__(self) -> AsyncLease:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        """Release the lease (see :meth:`release`); in a forked child, do nothing (as
        :meth:`Lease.__exit__ <django_redlock.Lease.__exit__>`)."""
        if self._left_inherited() or self._released:
            return
        lost = self._lost_reason
        release_error = None
        try:
            await self.release()
        except (LockLost, LeaseReleased) as error:
            release_error = error
        self._block_ended(exc, lost, release_error)

    def __enter__(self) -> NoReturn:
        # A plain `with` would never release (nothing can await the release there): refuse
        # it, and give the lock back in the background rather than hold it until exit.
        if not self._released:
            with contextlib.suppress(RuntimeError):  # no running loop: it runs out by ttl
                loop = asyncio.get_running_loop()
                # Kept by the loop, not by the lease: the task's frame holds the lease.
                keep_with_loop(loop, loop.create_task(self._release_quietly()))
        raise TypeError(
            "an AsyncLease is released with 'async with' (or 'await lease.release()'), "
            "not with a plain 'with'"
        )

    def __exit__(self, *exc_info: object) -> None:
        """Never reached (``__enter__`` raises); defined so ``with`` gets that far."""

    async def _release_quietly(self) -> None:
        with contextlib.suppress(LockLost, LeaseReleased):
            await self.release()


class AsyncLockManager(
    EngineConfigured[
        AsyncLease, Coroutine[Any, Any, AsyncLease], Callable[[float], Awaitable[None]]
    ]
):
    """Redlock for asyncio code: ``await manager.acquire(...)``, ``async with manager.lock()``.

    Takes the arguments of :class:`~django_redlock.LockManager` and raises the same errors;
    its configuration is the engine's (:attr:`engine`), shared with a sync manager when made
    with :meth:`sharing` (with connections of its own, per event loop).

    Args:
        sleep: how a blocking acquire waits between attempts. ``None`` (the default): until
            the release that hands it the lock is published to it, or the retry delay
            passes. A coroutine function of seconds (a test's fake clock,
            ``asyncio.sleep``) sleeps the retry delay instead, and hears no releases.

    The other arguments (``nodes``, ``ttl``, ``node_timeout``, ``retry_delay``,
    ``default_timeout``, ``drift_factor``, ``key_prefix``, ``max_ttl``, ``clock``,
    ``observer``) are as for :class:`~django_redlock.LockManager`.

    Raises:
        TypeError, ValueError: a bad argument; the message names it.
    """

    _lease_class = AsyncLease

    @classmethod
    def _on_engine(cls, engine: Engine) -> AsyncLockManager:
        """A manager on ``engine`` for a lease whose own manager is gone (AsyncLease): the
        one made last for it while that one lives (its connections to a loop keep it until
        that loop ends), so the leases of a dropped manager share one set of connections per
        loop rather than open one per call."""
        made = _ORPHANS.get(id(engine))
        if made is None or made.engine is not engine:
            made = cls.__new__(cls)
            made._share(engine, None)
            _ORPHANS[id(engine)] = made
        return made

    def _share(self, engine: Engine, sleep: Callable[[float], Awaitable[None]] | None) -> None:
        super()._share(engine, sleep)
        self._loops = PerLoop(
            partial(
                LoopConnections,
                engine.addresses,
                engine.hello,
                max_outstanding=MAX_OUTSTANDING,
                **stall_limits(engine.node_timeout),
            )
        )

    def _connections(self) -> LoopConnections:
        return self._loops.get(self)

    async def aclose(self) -> None:
        """Close this loop's connections."""
        self._connections().close()

    async def __aenter__(self) -> AsyncLockManager:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def _drive(self, procedure: Generator[Effect, Any, _R]) -> _R:
        """Run ``procedure`` on this loop's connections (``wire.asyncio.driver.drive``)."""
        engine = self.engine
        return await drive(procedure, self._connections(), engine.node_timeout, self._sleep)

    # -- acquire ---------------------------------------------------------------------------

    async def acquire(
        self,
        name: str,
        *,
        ttl: float | None = None,
        blocking: bool = True,
        timeout: float | ManagerDefault | None = MANAGER_DEFAULT,
        auto_extend: bool = False,
        max_hold: float | None = None,
        origin: str | None = None,
    ) -> AsyncLease:
        """Take lock ``name`` (see :meth:`LockManager.acquire <django_redlock.LockManager.acquire>`
        for the arguments).

        Cancellation: a task cancelled here owns nothing afterwards. A round in flight is
        released on every node it may have reached (the releases are queued behind its SETs),
        and a waiter leaves the line, so the next release wakes a live waiter.

        Raises:
            LockContended: another holder has it.
            QuorumUnreachable: too many nodes failed or timed out.
            TypeError, ValueError: a bad argument.
        """
        got = self._acquiring(name, ttl, blocking, timeout, auto_extend, max_hold, origin)
        if isinstance(got, AsyncLease):  # re-entered
            return got
        # Driven here, not through _drive: one coroutine less on every acquire.
        return await drive(got, self._loops.get(self), self.engine.node_timeout, self._sleep)

    async def adopt(
        self,
        handle: LeaseHandle | str,
        *,
        auto_extend: bool = False,
        max_hold: float | None = None,
        origin: str | None = None,
    ) -> AsyncLease:
        """Take over a lease another process gave away (see
        :meth:`LockManager.adopt <django_redlock.LockManager.adopt>`).

        Cancellation: a task cancelled here owns nothing; the keys the new token may have
        taken are released (written at once, without awaiting).

        Raises:
            LockLost: the lease ran out, was released or adopted elsewhere.
            QuorumUnreachable: too few nodes answered to take it over (the keys are handed
                back).
            TypeError, ValueError: not a handle, or one for another key prefix.
        """
        return await self._drive(self._adopting(handle, auto_extend, max_hold, origin))

    async def _release(self, lease: AsyncLease) -> None:
        """Release ``lease`` on the nodes and judge the round (see :meth:`AsyncLease.release`):
        carried out whatever happens to the calling task (``wire.asyncio.driver.finish_round``).

        Raises:
            LockLost: the lease had expired, or a quorum no longer held it.
        """
        engine = self.engine
        commands, yes, expired, identify = release_round(lease, len(engine.addresses))
        await finish_round(
            self._loops.get(self),
            Round(commands, yes, engine.quorum, None, identify, True),
            engine.node_timeout,
            partial(settle_exchange, lease, expired=expired),
        )

    async def _extend(self, lease: AsyncLease) -> float:
        return await self._drive(extend(self.engine, lease))

    async def _owned(self, lease: AsyncLease) -> bool:
        return await self._drive(owned(self.engine, lease))

    async def locked(self, name: str) -> bool:
        """Whether lock ``name`` is held on a quorum of the nodes now (one round trip; see
        :meth:`LockManager.locked <django_redlock.LockManager.locked>`).

        Raises:
            TypeError, ValueError: a bad name.
        """
        return flow.is_locked(self.engine.nodes, await self.holder(name))

    async def holder(self, name: str) -> dict[str, Any] | None:
        """Who holds lock ``name``, or None (one round trip; see
        :meth:`LockManager.holder <django_redlock.LockManager.holder>`).

        Raises:
            TypeError, ValueError: a bad name.
        """
        return await self._drive(holder(self.engine, name))

    def lock(
        self, name: str, **options: Unpack[AcquireOptions]
    ) -> contextlib.AbstractAsyncContextManager[AsyncLease]:
        """``async with manager.lock(name, ...) as lease``: acquire on enter, release on exit
        (the arguments of :meth:`acquire`)."""
        acquire_options(options)  # an unknown argument is refused here, not at enter
        return self._block(name, options)

    @contextlib.asynccontextmanager
    async def _block(self, name: str, options: AcquireOptions) -> AsyncIterator[AsyncLease]:
        async with await self.acquire(name, **options) as lease:
            yield lease

    async def lock_many(
        self, names: Iterable[str], **options: Unpack[AcquireOptions]
    ) -> AsyncLease:
        """Take several locks as one lease, all or nothing (see
        :meth:`LockManager.lock_many <django_redlock.LockManager.lock_many>`).

        Raises:
            LockContended, QuorumUnreachable: as :meth:`acquire`.
            TypeError, ValueError: a bad name (or a single str), no name, more than 1024.
        """
        # Only the nodes this process classified already: asking one would block the loop
        # (the transport then refuses the command on an unclassified cluster node alone).
        procedure, taken = self._many(names, options, ask=False)
        lease = await self._drive(procedure)
        lease.names = taken
        return lease

    async def acquire_shape(
        self, name: str, shape: Shape, **options: Unpack[AcquireOptions]
    ) -> AsyncLease:
        """Acquire a lease of ``shape`` named ``name`` (see
        :meth:`LockManager.acquire_shape <django_redlock.LockManager.acquire_shape>`).

        Raises:
            LockContended, QuorumUnreachable: as :meth:`acquire`.
            TypeError, ValueError: a bad argument.
        """
        return await self._drive(self._shaped(name, shape, options))

    async def force_release(self, name: str) -> int:
        """Delete lock ``name`` on every node, whoever holds it; returns how many nodes had
        it (see :meth:`LockManager.force_release <django_redlock.LockManager.force_release>`).

        Raises:
            TypeError, ValueError: a bad name.
        """
        return await self._drive(force_release(self.engine, name))
