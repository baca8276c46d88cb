"""The asyncio manager: :class:`AsyncLockManager` hands out :class:`AsyncLease` objects.

The same steps as :class:`~django_redlock.redlock.LockManager` (``django_redlock.core.flow``),
reported the same way (``django_redlock.core.reporting``), with the same configuration,
re-entry registry and observer (it wraps a sync manager); only the transport differs: the
asyncio one (``django_redlock.wire.aio``), per event loop, with no thread hop per call.

Renewal of ``auto_extend`` leases runs on the process's extender thread (one per process),
and the operator calls that are on no hot path (``locks``, ``force_release``,
``declare_fresh``) are the sync manager's; ``locked`` and ``holder`` are coroutines.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import weakref
from collections.abc import AsyncIterator, Coroutine, Iterable, Sequence
from functools import partial
from types import TracebackType
from typing import Any, NoReturn, Unpack

from django_redlock.core import flow
from django_redlock.core.arguments import validate_name, validate_names
from django_redlock.core.handle import LeaseHandle
from django_redlock.core.kinds import RWLock, Semaphore
from django_redlock.core.lease import BaseLease
from django_redlock.core.options import AcquireOptions, Checked, acquire_options
from django_redlock.core.owner import owner_scope
from django_redlock.core.shapes import Many, Shape
from django_redlock.exceptions import LeaseReleased, LockLost
from django_redlock.redlock import LockManager
from django_redlock.wire.aio import LoopConnections
from django_redlock.wire.scripts import PING
from django_redlock.wire.stall import MAX_OUTSTANDING, stall_limits

__all__ = ["AsyncLease", "AsyncLockManager"]

logger = logging.getLogger("django_redlock")


async def _take(guard: threading.Lock) -> None:
    """Take ``guard`` (an auto-extended lease's, shared with the extender thread) without
    blocking the event loop, and so that a cancelled task never ends up owning it.

    It is polled, never waited for in a worker thread: such a thread goes on waiting after
    its task is cancelled, takes the guard, and no one gives it back; the extender thread,
    which renews every auto-extended lease of the process, then blocks on it for good and
    all those leases expire. The extender holds the guard for one renewal round trip at most
    (bounded by the node timeout), so the polls are few and short.
    """
    delay = 0.0005
    while not guard.acquire(blocking=False):
        await asyncio.sleep(delay)
        delay = min(2 * delay, 0.02)


def _retrieve(task: asyncio.Future[None]) -> None:
    """Done-callback of a release that outlived its cancelled caller: read its outcome so
    asyncio does not report it as never retrieved (a LockLost is already logged and told
    to the observer by the release itself)."""
    if not task.cancelled() and task.exception() is not None:
        logger.debug("release finished after its caller was cancelled: %s", task.exception())


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

    __slots__ = ("_async_manager", "_closing")
    # The release a plain ``with`` started (see __enter__): set only then, never read.
    _closing: asyncio.Task[None]

    def __init__(self, manager: AsyncLockManager, **fields: Any) -> None:
        # The sync manager is the lease's host (clock, reporter, the extender's renewals)
        # and the sender of its signals, as for a sync lease.
        super().__init__(manager.sync, **fields)
        self._async_manager = manager

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
                gone, only those this renewal set again: see ``core/flow.lost_clean_up``).
            LeaseNotExtended: no quorum either way: the lease keeps its validity and keys.
            LeaseInherited: called in a forked child; nothing is sent to the nodes.
        """
        # Before the guard, as Lease.extend: a child forked while the extender renewed the
        # lease has a copy of the guard that nobody will ever give back.
        self._refuse_inherited()
        guard = self._guard
        if guard is None:
            self.check()
            return await self._async_manager._extend(self)
        await _take(guard)  # one renewal at a time, the extender's or ours
        try:
            self.check()
            return await self._async_manager._extend(self)
        finally:
            guard.release()

    async def release(self) -> None:
        """Delete the lock on every node where it still holds this lease's token (see
        :meth:`Lease.release <django_redlock.Lease.release>`). Shielded from cancellation:
        once called, the release is carried out even if the calling task is cancelled.

        Raises:
            LeaseInherited: called in a process forked from the lease's owner.
            LeaseReleased: called twice.
            LockLost: the lease had expired, or a quorum no longer held it.
        """
        self._refuse_inherited()
        if not self._end_hold():
            return
        finishing = asyncio.ensure_future(self._finish_release())
        try:
            await asyncio.shield(finishing)
        except asyncio.CancelledError:
            finishing.add_done_callback(_retrieve)
            raise

    async def _finish_release(self) -> None:
        guard = self._guard
        if guard is not None:
            # Wait out a renewal in flight, so it does not find the keys gone and call the
            # lease lost; none starts after it (the lease is marked released).
            await _take(guard)
            guard.release()
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
                self._closing = loop.create_task(self._release_quietly())
        raise TypeError(
            "an AsyncLease is released with 'async with' (or 'await lease.release()'), "
            "not with a plain 'with'"
        )

    def __exit__(self, *exc_info: object) -> None:
        """Never reached (``__enter__`` raises); defined so ``with`` gets that far."""

    async def _release_quietly(self) -> None:
        with contextlib.suppress(LockLost, LeaseReleased):
            await self.release()


class AsyncLockManager:
    """Redlock for asyncio code: ``await manager.acquire(...)``, ``async with manager.lock()``.

    Takes the same arguments as :class:`~django_redlock.LockManager` (except ``sleep``, which
    is ``asyncio.sleep``) and raises the same errors.
    """

    def __init__(self, nodes: Sequence[object], **options: Any) -> None:
        self._share(LockManager(nodes, **options))

    @classmethod
    def sharing(cls, sync: LockManager) -> AsyncLockManager:
        """An asyncio manager with ``sync``'s nodes, configuration, observer and re-entry
        registry (one set of owners for both), and its own per-loop connections."""
        manager = cls.__new__(cls)
        manager._share(sync)
        return manager

    def _share(self, sync: LockManager) -> None:
        self.sync = sync
        self._loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopConnections] = (
            weakref.WeakKeyDictionary()
        )
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        # Configuration and operator calls (ttl, quorum, nodes, locks, force_release, ...).
        return getattr(self.sync, name)

    def _connections(self) -> LoopConnections:
        loop = asyncio.get_running_loop()
        with self._lock:
            connections = self._loops.get(loop)
            if connections is None:
                connections = LoopConnections(
                    self.sync.addresses,
                    self.sync._hello,
                    max_outstanding=MAX_OUTSTANDING,
                    **stall_limits(self.sync.node_timeout),
                )
                self._loops[loop] = connections
                # Closes the connections when the loop's tasks are cancelled at its end
                # (asyncio.run does that): protocols have no reader task that would.
                connections.guard = loop.create_task(connections.close_at_loop_end())
        return connections

    async def aclose(self) -> None:
        """Close this loop's connections."""
        self._connections().close()

    async def acquire(self, name: str, **options: Unpack[AcquireOptions]) -> AsyncLease:
        """Take lock ``name`` (see :meth:`LockManager.acquire`).

        Cancellation: a task cancelled here owns nothing afterwards. A round in flight is
        released on every node it may have reached (the releases are queued behind its SETs),
        and a waiter leaves the line, so the next release wakes a live waiter.
        """
        sync = self.sync
        name = validate_name(name)
        # Checked before re-entry too, so a bad argument is refused the same way every time.
        checked = sync._acquire_arguments(*acquire_options(options))
        scope = owner_scope()
        held = sync._reenter(scope, name, AsyncLease)
        if held is not None:
            return held
        return await self._take(name, Shape(sync.key_prefix + name), scope, checked)

    async def _take(
        self, name: str, shape: Shape, scope: tuple[object, ...], checked: Checked
    ) -> AsyncLease:
        """Acquire a lease of ``shape``, its arguments checked (see
        :meth:`LockManager._take`)."""
        sync = self.sync
        connections = self._connections()
        subscriber = connections.subscriber
        queues = checked.blocking and shape.wake_key is not None
        if len(sync._quarantine.heard) < sync.quorum:
            # Hear from the nodes before the first acquire (see LockManager._first_contact):
            # the PONGs come after each new connection's hello replies. Before the acquire
            # begins, as in the sync manager, so it does not count against the timeout.
            await connections.run(
                [PING] * len(sync.addresses), sync.node_timeout, b"PONG", sync.quorum
            )
        waiter = subscriber.waiter_id() if queues else ""
        attempt = sync._begin(name, checked, waiter, shape)
        listening = False
        try:
            while True:
                commands = attempt.next_round(sync._quarantine.ms)
                start = sync._clock()
                try:
                    exchange = await connections.run(
                        commands, sync.node_timeout, attempt.decider, attempt.need, identify=True
                    )
                    results, granted = exchange.results, exchange.yes
                except BaseException:
                    # Cancelled (or interrupted) mid-round: some SETs may have landed, or may
                    # still land on a slow node. The releases go out now, without awaiting,
                    # queued behind the SETs on each connection.
                    connections.post(attempt.interrupted())
                    raise
                end = sync._clock()
                step = attempt.judge(results, granted, start, end)
                if isinstance(step, flow.Granted):
                    strays = attempt.strays(results)
                    if strays is not None:
                        connections.post(strays)
                    make = partial(AsyncLease, self)
                    free = connections.post
                    return sync._grant(make, free, attempt, step, results, scope, checked)
                # Written now, no await, so a cancellation cannot skip it.
                connections.post(step.clean_up)
                error = sync._failed(step, checked.origin)
                if error is not None:  # the place in line is left below
                    raise error
                wake_key = shape.wake_key
                if not waiter or wake_key is None:
                    await asyncio.sleep(step.delay)  # a try that never queues polls
                    attempt.waited(False)
                elif not listening and await subscriber.subscribe(
                    wake_key, sync.node_timeout, waiter
                ):
                    # Just subscribed: the try right after covers a release that came between
                    # our last try and the subscription (see LockManager.acquire).
                    listening = True
                else:
                    listening = True
                    attempt.waited(await subscriber.wait(waiter, step.delay))
        except BaseException:
            leave = attempt.left_line()
            if leave is not None:
                # Gave up, cancelled or interrupted: leave the line now (no await). A place
                # left behind would get the next release's wake-up, and the waiters behind it
                # would wait until it lapses.
                connections.post(leave)
            raise
        finally:
            if waiter:
                subscriber.unregister(waiter)

    async def adopt(
        self,
        handle: LeaseHandle | str,
        *,
        auto_extend: bool = False,
        max_hold: float | None = None,
        origin: str | None = None,
    ) -> AsyncLease:
        """Take over a lease another process gave away (see :meth:`LockManager.adopt`).

        Cancellation: a task cancelled here owns nothing; the keys the new token may have
        taken are released (written at once, without awaiting).
        """
        sync = self.sync
        adoption = sync._adoption(handle, auto_extend, max_hold, origin)
        connections = self._connections()
        size = len(sync.addresses)
        if len(sync._quarantine.heard) < sync.quorum:
            await connections.run([PING] * size, sync.node_timeout, b"PONG", sync.quorum)
        start = sync._clock()
        try:
            results = (
                await connections.run(
                    adoption.commands,
                    sync.node_timeout,
                    flow.NEVER_YES,
                    size,
                    give_up=size - 1,
                    identify=True,
                )
            ).results
            return sync._adopted(partial(AsyncLease, self), adoption, results, start)
        except BaseException as error:
            connections.post(adoption.undo(error))
            raise

    async def _release(self, lease: AsyncLease) -> None:
        sync = self.sync
        expired = lease._expires_at <= sync._clock()
        exchange = await self._connections().run(
            flow.release_round(len(sync.addresses), lease._shape, lease.token, lease._waiter),
            sync.node_timeout,
            lease._shape.release_yes,
            sync.quorum,
            queue_behind=True,  # queued behind what a node owes (LockManager._release)
        )
        results, deleted = exchange.results, exchange.yes
        lease._settle_release(results, deleted, expired)

    async def _extend(self, lease: AsyncLease) -> float:
        sync = self.sync
        size = len(sync.addresses)
        if lease._expired_before_renewal():
            self._connections().post(lease._shape.clean_up(lease.token, None, size))
            raise lease._lost_error()
        commands = sync._extend_round(lease)
        start = sync._clock()
        # Never given up early on refusals (LockManager._extend says why).
        results = (
            await self._connections().run(commands, sync.node_timeout, 1, sync.quorum, give_up=size)
        ).results
        try:
            return lease._settle_extend(start, sync._clock(), results)
        except LockLost:
            # The lease has ended (never on a mere miss, LockManager._extend): best effort,
            # no await, free the keys flow.lost_clean_up says to.
            self._connections().post(
                flow.lost_clean_up(lease._shape, lease.token, lease._lost_cause, results)
            )
            raise

    async def _owned(self, lease: AsyncLease) -> bool:
        sync = self.sync
        owned = (
            await self._connections().run(
                flow.owns_round(len(sync.addresses), lease._shape, lease.token),
                sync.node_timeout,
                1,
                sync.quorum,
            )
        ).yes
        return flow.owned(sync._nodes, owned, lease.validity)

    async def locked(self, name: str) -> bool:
        """Whether lock ``name`` is held on a quorum of the nodes now (one round trip; see
        :meth:`LockManager.locked`).

        Raises:
            TypeError, ValueError: a bad name.
        """
        return flow.is_locked(self.sync._nodes, await self.holder(name))

    async def holder(self, name: str) -> dict[str, Any] | None:
        """Who holds lock ``name``, or None (one round trip; see :meth:`LockManager.holder`).

        Raises:
            TypeError, ValueError: a bad name.
        """
        sync = self.sync
        size = len(sync.addresses)
        results = (
            await self._connections().run(  # every node's answer is wanted
                flow.holder_round(size, sync.key(name)), sync.node_timeout, None, size, give_up=size
            )
        ).results
        return flow.holder_of(results)

    def semaphore(self, name: str, limit: int) -> Semaphore[Coroutine[Any, Any, AsyncLease]]:
        """The semaphore ``name`` of ``limit`` slots; ``await sem.acquire(...)`` (see
        :meth:`LockManager.semaphore`)."""
        return Semaphore(self, validate_name(name), limit)

    def rwlock(self, name: str) -> RWLock[Coroutine[Any, Any, AsyncLease]]:
        """The read-write lock ``name``; ``await rw.read(...)`` / ``await rw.write(...)``
        (see :meth:`LockManager.rwlock`)."""
        return RWLock(self, validate_name(name))

    async def lock_many(
        self, names: Iterable[str], **options: Unpack[AcquireOptions]
    ) -> AsyncLease:
        """Take several locks as one lease, all or nothing (see
        :meth:`LockManager.lock_many`)."""
        checked = validate_names(names)
        shape = Many([self.sync.key_prefix + name for name in checked])
        lease = await self._take_shape(" + ".join(checked), shape, dict(options))
        lease.names = tuple(checked)
        return lease

    async def _take_shape(self, name: str, shape: Shape, options: dict[str, Any]) -> AsyncLease:
        checked = self.sync._acquire_arguments(*acquire_options(options))
        return await self._take(name, shape, owner_scope(), checked)

    def lock(
        self, name: str, **options: Unpack[AcquireOptions]
    ) -> contextlib.AbstractAsyncContextManager[AsyncLease]:
        """``async with manager.lock(name, ...) as lease``: acquire on enter, release on exit
        (the arguments of :meth:`LockManager.acquire`)."""
        acquire_options(options)  # an unknown argument is refused here, not at enter
        return self._block(name, options)

    @contextlib.asynccontextmanager
    async def _block(self, name: str, options: AcquireOptions) -> AsyncIterator[AsyncLease]:
        async with await self.acquire(name, **options) as lease:
            yield lease
