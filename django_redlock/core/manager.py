"""The sync Redlock manager: :class:`LockManager` hands out :class:`Lease` objects (public
import path ``django_redlock.redlock``).

This module imports no Django (a test proves it), so it can be used from any Python process.

The algorithm follows the Redis "Distributed Locks with Redis" page (the Redlock section):

1. take the current time on a monotonic clock;
2. try to set the key with a random token on all N nodes, each with a timeout far below the
   lease, here all at once (one round trip whatever N);
3. the lock is acquired when a quorum ``N // 2 + 1`` granted it and the validity
   ``ttl - elapsed - (ttl * drift_factor + 2 ms)`` is still positive;
4. otherwise unlock every node (the failed ones too: a timed-out SET may still have landed)
   and retry after a random delay.

Every step is decided once, by a procedure (``django_redlock.procedures``) and the flow it
decides with (``django_redlock.procedures.flow``); what both managers do alike (construction,
argument checks, the procedure each call runs) is ``core.configured``'s, and what they share
at run time (configuration, quarantine, re-entry registry, reporting, owners) the engine's
(``django_redlock.core.engine``), which the asyncio manager (``django_redlock.core.amanager``)
can hold too. This module only drives the procedures on the sync transport
(``django_redlock.wire.sync.connections``, held by the engine) and waits.

Redlock alone is an *efficiency* lock: a process pause or a clock jump can let two holders
overlap (Kleppmann, "How to do distributed locking", 2016). Correctness needs the fencing
token checked by the storage; see ``django_redlock.models.FencedModel``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Generator, Iterable, Iterator
from types import TracebackType
from typing import Any, TypeVar, Unpack

from django_redlock.core import turns
from django_redlock.core.configured import EngineConfigured
from django_redlock.core.engine import (
    DEFAULT_DRIFT_FACTOR,
    DEFAULT_NODE_TIMEOUT,
    DEFAULT_RETRY_DELAY,
    DEFAULT_TIMEOUT,
    DEFAULT_TTL,
    Engine,
)
from django_redlock.core.handle import LeaseHandle
from django_redlock.core.lease import TAKER_PID, BaseLease
from django_redlock.core.owner import MAX_OWNER_BYTES
from django_redlock.core.reporting import LockObserver
from django_redlock.exceptions import LeaseReleased, LockLost
from django_redlock.procedures import flow
from django_redlock.procedures.arguments import (
    MAX_NAME_BYTES,
    MAX_ORIGIN_BYTES,
    MAX_TTL,
)
from django_redlock.procedures.effects import Effect
from django_redlock.procedures.operators import force_release, holder
from django_redlock.procedures.options import (
    MANAGER_DEFAULT,
    AcquireOptions,
    ManagerDefault,
    acquire_options,
)
from django_redlock.procedures.shapes import Shape
from django_redlock.wire import process
from django_redlock.wire.scripts import NODE_KEY
from django_redlock.wire.sync.driver import drive

__all__ = [
    "DEFAULT_DRIFT_FACTOR",
    "DEFAULT_NODE_TIMEOUT",
    "DEFAULT_RETRY_DELAY",
    "DEFAULT_TIMEOUT",
    "DEFAULT_TTL",
    "MANAGER_DEFAULT",
    "MAX_NAME_BYTES",
    "MAX_ORIGIN_BYTES",
    "MAX_OWNER_BYTES",
    "MAX_TTL",
    "NODE_KEY",
    "AcquireOptions",
    "BaseLease",
    "Lease",
    "LockManager",
    "LockObserver",
]

_R = TypeVar("_R")


class Lease(BaseLease):
    """A held lock: returned by :meth:`LockManager.acquire`, released by :meth:`release`,
    or by leaving its ``with`` block (see :class:`~django_redlock.core.lease.BaseLease` for
    the attributes)."""

    __slots__ = ()
    # Held in a thread holding many, it may be untracked by the collector (core.lease's
    # _cycle_free): it adds no attribute that could refer back to it.
    _cycle_free_class = True
    # Hosted by the engine its manager holds (clock, reporter, renewal): the sync rounds of
    # a lease (extend, release, owned) run on the engine's sync transport.
    _host: Engine

    def extend(self) -> float:
        """Renew the lease to its full ttl on a quorum; returns the new validity in seconds.

        Keys that hold this lease's token are renewed; a key a node lost (a restart without
        data) is set again there, unless another holder has the name on that node, and counts
        only while the nodes that held the lease can still make a quorum
        (``scripts/extend.lua`` and ``procedures/flow.judge_extend`` give the rule and why it is
        safe). A key held by anyone else is never touched.

        Raises:
            LeaseReleased: the lease was released.
            LockLost: the lease had ended: its validity ran out (also when the renewal
                finished after it), or a quorum of nodes answered that they no longer hold
                it. It stays lost, and its keys are freed (best effort): everywhere, but for
                a lease found gone only the keys this renewal set again (the others expire by
                themselves; see ``procedures/flow.lost_clean_up``).
            LeaseNotExtended: neither a quorum renewed it nor a quorum refused it (nodes
                did not answer): nothing changed, the lease keeps the validity it had and
                its keys; try again before ``validity`` runs out.
            LeaseInherited: called in a forked child; nothing is sent to the nodes.
        """
        self._refuse_inherited()
        if self._guard is None:
            self.check()
            return self._host.renew(self)
        turns.take(self)  # one renewal at a time, the extender's or ours
        try:
            self.check()
            return self._host.renew(self)
        finally:
            turns.give_back(self)

    def release(self) -> None:
        """Delete the lock on every node, where it still holds this lease's token.

        Raises:
            LeaseReleased: called twice.
            LockLost: the lease had expired before the release, or a quorum of nodes said it
                was no longer held: work done under it may have overlapped another holder.
                (Nodes that fail to answer while the lease is still valid are logged, not
                raised: their keys expire by themselves.)
            LeaseInherited: called in a forked child; the parent's keys are left alone.
        """
        if self._state[TAKER_PID] != process.PID:  # a forked child: no call in the usual case
            self._refuse_inherited()
        if self._guard is None:
            if self._end_hold():
                self._host.release(self)
            return
        turns.take(self)  # a renewal in flight ends first, and none starts after this
        try:
            if self._end_hold():
                self._host.release(self)
        finally:
            turns.give_back(self)

    def owned(self) -> bool:
        """Ask the nodes (one round trip): True while a quorum still holds this lease's token
        and its validity has not run out. Unlike :attr:`lost` (what this process noticed),
        this sees what happened elsewhere: an operator's force release, keys evicted or
        expired on the nodes.

        Raises:
            LeaseInherited: called in a process forked from the lease's owner.
        """
        self._refuse_inherited()
        if self._released or self.validity <= 0:
            return False
        return self._host.owned(self)

    def __enter__(self) -> Lease:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        """Release the lease (see :meth:`release`); in a forked child, do nothing.

        A child leaves its parent's ``with`` block on its way out (``sys.exit`` unwinding the
        inherited stack): the lease is the parent's, so the keys stay and nothing is raised,
        which would only turn the child's unrelated exit into a crash. A warning is logged.
        """
        if self._left_inherited() or self._released:
            return
        lost = self._lost_reason
        try:
            self.release()
        except (LockLost, LeaseReleased) as error:
            self._block_ended(exc, lost, error)
        else:
            self._block_ended(exc, lost, None)


class LockManager(EngineConfigured[Lease, Lease, Callable[[float], None]]):
    """Redlock over N independent Redis/Valkey masters.

    Args:
        nodes: node URLs (``redis://``, ``rediss://``, ``unix://``) or redis-py clients.
            Use an odd number of independent masters (no replicas): 3 or 5.
        ttl: default lease length in seconds.
        node_timeout: seconds each node has per command (connect included); a node slower
            than this is a failed vote. Must be well below the ttl.
        retry_delay: mean seconds between attempts of a blocking acquire (±50% jitter).
        default_timeout: seconds a blocking acquire waits when its ``timeout`` is not given
            (``None``: forever, discouraged).
        drift_factor: share of the ttl set aside for clock drift, 0 ≤ f < 0.5.
        key_prefix: prepended to every lock name to form the Redis key.
        max_ttl: the longest lease any acquire may ask for (default ``max(ttl, 60)``), and
            so the restart quarantine: a node that lost its data votes again only this many
            seconds after it came back, when every lease it may have granted has run out.
        clock: monotonic clock in seconds for lease validity and retry budgets (tests
            inject a fake one; per-node network timeouts always use real time).
        sleep: how a blocking acquire waits between attempts. ``None`` (the default): until
            the release that hands it the lock is published to it, or the retry delay
            passes. A function of seconds (a test's fake clock, ``time.sleep``) sleeps the
            retry delay instead, and hears no releases.
        observer: told of every acquire, release, loss and give-up (see :class:`LockObserver`).

    The configuration is the engine's (:attr:`engine`, shared with an
    :class:`~django_redlock.aredlock.AsyncLockManager` made with ``sharing``); the
    attributes below read it.

    Raises:
        TypeError, ValueError: a bad argument; the message names it.
    """

    _lease_class = Lease

    def __enter__(self) -> LockManager:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _drive(self, procedure: Generator[Effect, Any, _R]) -> _R:
        """Run ``procedure`` on this thread's connections (``wire.sync.driver.drive``)."""
        engine = self.engine
        return drive(procedure, engine.connections.get(), engine.node_timeout, self._sleep)

    # -- acquire ---------------------------------------------------------------------------

    def acquire(
        self,
        name: str,
        *,
        ttl: float | None = None,
        blocking: bool = True,
        timeout: float | ManagerDefault | None = MANAGER_DEFAULT,
        auto_extend: bool = False,
        max_hold: float | None = None,
        origin: str | None = None,
    ) -> Lease:
        """Take the lock ``name``; return its :class:`Lease`.

        Args:
            name: the lock name (text, at most :data:`MAX_NAME_BYTES` UTF-8 bytes).
            ttl: lease length in seconds (default: the manager's).
            blocking: retry until ``timeout`` (True) or make exactly one attempt (False).
            timeout: seconds to keep trying when blocking (default: the manager's
                ``default_timeout``, 10 s unless configured); ``None`` waits forever
                (discouraged). The attempt in flight is bounded too: acquire returns or raises
                within ``timeout + node_timeout`` plus scheduling noise.
            auto_extend: renew the lease in the background every ``ttl / 3`` while it is
                held; a failed renewal marks it lost (``lease.lost``, ``lease.check()``).
            max_hold: with ``auto_extend``, seconds after which renewal stops, so a stuck
                holder cannot keep the lock forever (the lease then runs out within a ttl).
            origin: free text stored with the lock to tell operators where it was taken
                (a view or command name); cut to :data:`MAX_ORIGIN_BYTES` UTF-8 bytes.

        Raises:
            LockContended: another holder has it.
            QuorumUnreachable: too many nodes failed or timed out.
            TypeError, ValueError: a bad argument.
        """
        got = self._acquiring(name, ttl, blocking, timeout, auto_extend, max_hold, origin)
        if isinstance(got, Lease):  # re-entered
            return got
        engine = self.engine
        return drive(got, engine.connections.get(), engine.node_timeout, self._sleep)

    def adopt(
        self,
        handle: LeaseHandle | str,
        *,
        auto_extend: bool = False,
        max_hold: float | None = None,
        origin: str | None = None,
    ) -> Lease:
        """Take over a lease another process gave away with ``lease.handle()`` (one round
        trip): the keys move to a new token on a quorum, keeping their expiry, and the
        returned :class:`Lease` extends (to the handle's ttl) and releases like any other.
        The first process's token is refused from then on.

        Args:
            handle: a :class:`~django_redlock.core.handle.LeaseHandle` or its ``dumps()`` text.
            auto_extend: as for :meth:`acquire`.
            max_hold: as for :meth:`acquire`.
            origin: as for :meth:`acquire`.

        Raises:
            LockLost: the lease ran out, was released or adopted elsewhere: there is nothing
                to take over.
            QuorumUnreachable: too few nodes answered to take it over; the keys are handed
                back, so the same handle can be adopted again while its lease lasts.
            TypeError, ValueError: not a handle, or one for another key prefix.
        """
        return self._drive(self._adopting(handle, auto_extend, max_hold, origin))

    def locked(self, name: str) -> bool:
        """Whether lock ``name`` is held on a quorum of the nodes now (one round trip, by
        anyone; see :meth:`holder` for who).

        Raises:
            TypeError, ValueError: a bad name.
        """
        return flow.is_locked(self.engine.nodes, self.holder(name))

    def holder(self, name: str) -> dict[str, Any] | None:
        """Who holds lock ``name``, from the owner metadata stored with it, or None.

        Returns the owner dict (host, pid, thread, task, origin, acquired_at as epoch
        seconds) as found on most nodes that answered, plus ``nodes`` (how many hold it) and
        ``ttl`` (the longest remaining seconds among them). Never the token.

        Raises:
            TypeError, ValueError: a bad name.
        """
        return self._drive(holder(self.engine, name))

    def lock(
        self, name: str, **options: Unpack[AcquireOptions]
    ) -> contextlib.AbstractContextManager[Lease]:
        """A context manager: acquire on enter (yielding the :class:`Lease`), release on exit.

        Takes the same arguments as :meth:`acquire` and raises what it raises; leaving the
        block raises :class:`LockLost` if the lease was lost, unless the block itself raised.
        """
        acquire_options(options)  # an unknown argument is refused here, not at enter
        return self._block(name, options)

    @contextlib.contextmanager
    def _block(self, name: str, options: AcquireOptions) -> Iterator[Lease]:
        with self.acquire(name, **options) as lease:
            yield lease

    def lock_many(self, names: Iterable[str], **options: Unpack[AcquireOptions]) -> Lease:
        """Take the locks of every name in ``names`` as one lease, all or nothing, in one
        round trip per try; released (and extended) together. The locks are the very locks
        of ``acquire(name)``. Deadlock-free: a try takes every lock or none on each node and
        holds nothing while it waits; a blocking call polls (jittered ``retry_delay``) and
        never queues, so it may wait longer than single locks' fair line would.

        Takes the arguments of :meth:`acquire`; the lease's ``name`` is the names, sorted,
        joined by ``" + "``; ``lease.names`` lists them.

        Raises:
            LockContended, QuorumUnreachable: as :meth:`acquire`.
            TypeError, ValueError: a bad name (or a single str), no name, more than 1024.
        """
        procedure, taken = self._many(names, options, ask=True)
        lease = self._drive(procedure)
        lease.names = taken
        return lease

    def acquire_shape(self, name: str, shape: Shape, **options: Unpack[AcquireOptions]) -> Lease:
        """Acquire a lease of ``shape`` (``procedures/shapes.py``: a semaphore slot, a read or
        write lease, several locks) named ``name``, with ``acquire``'s keyword ``options``;
        never re-entrant. What the handles of ``core/kinds.py`` call.

        Raises:
            LockContended, QuorumUnreachable: as :meth:`acquire`.
            TypeError, ValueError: a bad argument.
        """
        return self._drive(self._shaped(name, shape, options))

    def force_release(self, name: str) -> int:
        """Delete lock ``name`` on every node, whoever holds it; returns how many nodes had
        it. For operators: the evicted holder is not told, so pair it with a fencing token
        bump (the admin page does) wherever writes must be refused.

        Raises:
            TypeError, ValueError: a bad name.
        """
        return self._drive(force_release(self.engine, name))
