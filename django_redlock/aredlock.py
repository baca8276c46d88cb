"""The asyncio twin of :class:`~django_redlock.redlock.LockManager`: no thread hop per call.

Same algorithm, same Lua scripts, same validity arithmetic and errors; the transport is an
asyncio protocol instead of non-blocking sockets: per event loop, one connection per node,
shared by every task of that loop. A command is written to every node at once (one round
trip whatever N); each connection has a FIFO of reply handlers, called in order as replies are
parsed in ``data_received``, so replies can never be handed to the wrong command, and commands
of many tasks pipeline on one socket. The outcome is known at a quorum of yes votes, or once a
quorum is no longer possible; a node that owes too many replies is skipped without sending.
Waiting tasks are woken by the release through per-loop pub/sub streams (``_AsyncSubscriber``).

Why not ``redis.asyncio``: five ``evalsha`` calls under ``asyncio.gather`` cost 1.2 ms a pair
or more on this project's benchmark machine, three times this transport or more, and its
clients retry by default. Node URLs and redis-py clients are accepted all the same.

Renewal of ``auto_extend`` leases runs on the process's extender thread (one per process),
and the operator calls (``holder``, ``locks``, ``force_release``, ``declare_fresh``) are the
sync manager's: they are not on any hot path.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import secrets
import threading
import time
import weakref
from collections.abc import Sequence
from types import TracebackType
from typing import Any, NoReturn

from django_redlock.core.arguments import clip_origin, validate_name
from django_redlock.exceptions import (
    LeaseReleased,
    LockLost,
)
from django_redlock.redlock import (
    MANAGER_DEFAULT,
    BaseLease,
    LockManager,
    _ManagerDefault,
    _owner_scope,
)
from django_redlock.wire.aio import LoopConnections
from django_redlock.wire.scripts import (
    GRANTED,
    PING,
    acquire_command,
    extend_command,
    leave_command,
    owns_command,
    release_command,
)

__all__ = ["AsyncLease", "AsyncLockManager"]

logger = logging.getLogger("django_redlock")  # the sync manager's logger: one log, both paths


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
    :class:`~django_redlock.redlock.BaseLease`).

    Its own type, not a :class:`~django_redlock.Lease`: its ``extend``/``release`` are
    coroutines, so it is never where code expects a lease that a plain ``with`` releases.
    A plain ``with`` raises ``TypeError``.

    Cancellation: a task cancelled in ``release()`` still releases (the release is shielded
    and finishes in the background); one cancelled in ``extend()`` leaves the lease as it
    was, held until its current validity runs out (or renewed by auto-extension).
    """

    _async_manager: AsyncLockManager
    _closing: asyncio.Task[None] | None = None

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
            LockLost: the lease was not renewed in time on a quorum; it is now lost.
        """
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
        if self._released:
            raise LeaseReleased(self.name)
        if self._depth > 1:
            self._depth -= 1  # an inner re-entry ends; the keys stay until the last exit
            return
        # Released from now on, whatever happens to this task: the extender starts no more
        # renewals of it, and a second release raises.
        self._released = True
        self._manager._forget_owner(self)
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
        if self._left_inherited() or self._released:
            return
        lost = self._lost_reason
        if exc is None:
            await self.release()  # raises LockLost itself when the nodes say it was lost
            if lost is not None:
                raise LockLost(self.name, lost)
            return
        try:
            await self.release()
        except (LockLost, LeaseReleased) as release_error:
            # Never hide the block's own exception behind the release's (as Lease does).
            logger.warning("releasing %r after an error: %s", self.name, release_error)

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
        self._wrap(LockManager(nodes, **options))

    def _wrap(self, sync: LockManager) -> None:
        """Share ``sync``'s configuration, owners and observer (``get_async_manager``)."""
        self.sync = sync
        self._loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopConnections] = (
            weakref.WeakKeyDictionary()
        )
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        # Configuration and operator calls (ttl, quorum, nodes, holder, locks, ...).
        return getattr(self.sync, name)

    def _connections(self) -> LoopConnections:
        loop = asyncio.get_running_loop()
        with self._lock:
            connections = self._loops.get(loop)
            if connections is None:
                connections = LoopConnections(self.sync.addresses, self.sync._hello)
                self._loops[loop] = connections
                # Closes the connections when the loop's tasks are cancelled at its end
                # (asyncio.run does that): protocols have no reader task that would.
                connections.guard = loop.create_task(connections.close_at_loop_end())
        return connections

    async def aclose(self) -> None:
        """Close this loop's connections."""
        self._connections().close()

    async def acquire(
        self,
        name: str,
        *,
        ttl: float | None = None,
        blocking: bool = True,
        timeout: float | _ManagerDefault | None = MANAGER_DEFAULT,
        auto_extend: bool = False,
        max_hold: float | None = None,
        origin: str | None = None,
    ) -> AsyncLease:
        """Take lock ``name`` (see :meth:`LockManager.acquire`).

        Cancellation: a task cancelled here owns nothing afterwards. A round in flight is
        released on every node it may have reached (the releases are queued behind its SETs),
        and a waiter leaves the line, so the next release wakes a live waiter.
        """
        sync = self.sync
        name = validate_name(name)
        # Checked before re-entry too, so a bad argument is refused the same way every time.
        seconds, wait, hold = sync._acquire_arguments(
            ttl, blocking, timeout, auto_extend, max_hold, origin
        )
        scope = _owner_scope()
        held = sync._held.get((scope, name))
        if isinstance(held, AsyncLease) and not held.released and not held.lost:
            held._depth += 1
            return held
        origin = clip_origin(origin)
        key = sync.key_prefix + name
        ttl_ms = math.ceil(seconds * 1000)
        owner = sync._owner(origin)
        started = sync._clock()
        deadline = None if (blocking and wait is None) else started + (wait or 0.0)
        connections = self._connections()
        subscriber = connections.subscriber
        waiter = subscriber.waiter_id() if blocking else ""
        ticket = time.time_ns() // 1000
        lifetime_ms = math.ceil(max(1.0, 4 * sync.retry_delay) * 1000)
        size = len(sync.addresses)
        attempts = 0
        listening = False
        polls = 0  # waits in a row that ended without a wake-up (see _retry_delay)
        if len(sync._quarantine.heard) < sync.quorum:
            # Hear from the nodes before the first acquire (see LockManager._first_contact):
            # the PONGs come after each new connection's hello replies.
            await connections.run([PING] * size, sync.node_timeout, b"PONG", sync.quorum)
        if waiter:
            subscriber.register(waiter)  # from now on a release naming us is kept
        try:
            while True:
                attempts += 1
                token = secrets.token_hex(20)
                command = acquire_command(
                    key, token, ttl_ms, owner, sync._quarantine.ms, waiter, ticket, lifetime_ms
                )
                start = sync._clock()
                try:
                    results, granted, _ = await connections.run(
                        [command] * size, sync.node_timeout, GRANTED, sync.quorum, identify=True
                    )
                except BaseException:
                    # Cancelled (or interrupted) mid-round: some SETs may have landed, or may
                    # still land on a slow node, and nobody would release them. The releases go
                    # out now, without awaiting, queued behind the SETs on each connection.
                    connections.post([release_command(key, token)] * size)
                    raise
                elapsed = sync._clock() - start
                validity = sync._validity(seconds, elapsed)
                if granted >= sync.quorum and validity > 0:
                    sync._log_granted(name, results, granted)
                    lease = AsyncLease(
                        sync,
                        name=name,
                        key=key,
                        token=token,
                        ttl=seconds,
                        expires_at=start + elapsed + validity,
                        acquired_at=start + elapsed,
                        origin=origin,
                    )
                    lease._async_manager = self
                    sync._adopt(lease, scope, waiter, auto_extend, hold, started)
                    return lease
                # Failed: unlock wherever our SET may have landed (not where another holder
                # answered); written now, no await, so a cancellation cannot skip it.
                release = release_command(key, token)
                connections.post([None if type(reply) is int else release for reply in results])
                error = sync._failure(name, results, granted, elapsed, attempts)
                now = sync._clock()
                if not blocking or (deadline is not None and now >= deadline):
                    raise sync._give_up(error, origin, now - started)
                delay = sync._retry_delay(now, deadline, polls)
                if not listening and await subscriber.subscribe(key, sync.node_timeout):
                    # Just subscribed: the try right after covers a release that came between
                    # our last try and the subscription (see LockManager.acquire).
                    listening = True
                else:
                    listening = True
                    if not await subscriber.wait(waiter, delay):
                        polls += 1
        except BaseException:
            if waiter:
                # Gave up, cancelled or interrupted: leave the line now (no await). A place left
                # behind would get the next release's wake-up, and the waiters behind it would
                # wait until it lapses.
                connections.post([leave_command(key, waiter)] * size)
            raise
        finally:
            if waiter:
                subscriber.unregister(waiter)

    async def _release(self, lease: AsyncLease) -> None:
        sync = self.sync
        expired = lease._expires_at <= sync._clock()
        results, deleted, _ = await self._connections().run(
            [release_command(lease.key, lease.token, lease._waiter)] * len(sync.addresses),
            sync.node_timeout,
            1,
            sync.quorum,
            capped=False,
        )
        sync._judge_release(lease, results, deleted, expired)

    async def _extend(self, lease: AsyncLease) -> float:
        sync = self.sync
        size = len(sync.addresses)
        start = sync._clock()
        results, extended, refused = await self._connections().run(
            [extend_command(lease.key, lease.token, math.ceil(lease.ttl * 1000))] * size,
            sync.node_timeout,
            1,
            sync.quorum,
        )
        try:
            return sync._judge_extend(lease, start, sync._clock(), results, extended, refused)
        except LockLost:
            # Best effort, no await: free the keys we may still hold.
            self._connections().post([release_command(lease.key, lease.token)] * size)
            raise

    async def _owned(self, lease: AsyncLease) -> bool:
        sync = self.sync
        _, owned, _ = await self._connections().run(
            [owns_command(lease.key, lease.token)] * len(sync.addresses),
            sync.node_timeout,
            1,
            sync.quorum,
        )
        return owned >= sync.quorum and lease.validity > 0

    def lock(self, name: str, **options: Any) -> _AsyncLockContext:
        """``async with manager.lock(name, ...) as lease``: acquire on enter, release on exit."""
        return _AsyncLockContext(self, name, options)


class _AsyncLockContext:
    def __init__(self, manager: AsyncLockManager, name: str, options: dict[str, Any]) -> None:
        self._manager = manager
        self._name = name
        self._options = options
        self._lease: AsyncLease | None = None

    async def __aenter__(self) -> AsyncLease:
        self._lease = await self._manager.acquire(self._name, **self._options)
        return self._lease

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        assert self._lease is not None
        await self._lease.__aexit__(exc_type, exc, traceback)
