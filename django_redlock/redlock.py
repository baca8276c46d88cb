"""The sync Redlock manager: :class:`LockManager` hands out :class:`Lease` objects.

This module imports no Django (a test proves it), so it can be used from any Python process.

The algorithm follows the Redis "Distributed Locks with Redis" page (the Redlock section):

1. take the current time on a monotonic clock;
2. try to set the key with a random token on all N nodes, each with a timeout far below the
   lease, here all at once (one round trip whatever N);
3. the lock is acquired when a quorum ``N // 2 + 1`` granted it and the validity
   ``ttl - elapsed - (ttl * drift_factor + 2 ms)`` is still positive;
4. otherwise unlock every node (the failed ones too: a timed-out SET may still have landed)
   and retry after a random delay.

The steps themselves are plain functions over replies (``django_redlock.core.flow``), shared
with the asyncio manager (``django_redlock.aredlock``); what is logged and told to the
observer is said in one place (``django_redlock.core.reporting``). This module moves the
commands to the nodes through the sync transport (``django_redlock.wire.connection_set``) and waits.

Redlock alone is an *efficiency* lock: a process pause or a clock jump can let two holders
overlap (Kleppmann, "How to do distributed locking", 2016). Correctness needs the fencing
token checked by the storage; see ``django_redlock.models.FencedModel``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import secrets
import socket
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import partial
from types import TracebackType
from typing import Any, TypeVar, Unpack

from django_redlock.core import extender, flow
from django_redlock.core.arguments import (
    MAX_NAME_BYTES,
    MAX_ORIGIN_BYTES,
    MAX_TTL,
    check_drift_factor,
    check_key_prefix,
    check_max_ttl,
    check_seconds,
    check_timeout,
    check_ttl,
    clip_origin,
    validate_name,
    validate_names,
)
from django_redlock.core.handle import LeaseHandle, as_handle
from django_redlock.core.health import declare_fresh
from django_redlock.core.kinds import RWLock, Semaphore
from django_redlock.core.lease import BaseLease, held_on
from django_redlock.core.listing import LockListing, list_locks
from django_redlock.core.options import (
    MANAGER_DEFAULT,
    AcquireOptions,
    Checked,
    ManagerDefault,
    acquire_options,
)
from django_redlock.core.owner import MAX_OWNER_BYTES, OwnerRecords, owner_scope
from django_redlock.core.reporting import LockObserver, Reporter
from django_redlock.core.shapes import Many, Shape
from django_redlock.exceptions import (
    LeaseReleased,
    LockLost,
    LockNotAcquired,
    QuorumUnreachable,
    RedlockError,
)
from django_redlock.wire.connection_set import ConnectionSet, ThreadConnections
from django_redlock.wire.nodes import NodeAddress, parse_node, parse_nodes
from django_redlock.wire.scripts import HOT_SCRIPTS, NODE_KEY, PING, Command
from django_redlock.wire.setup import Hello
from django_redlock.wire.stall import MAX_OUTSTANDING, stall_limits

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

DEFAULT_TTL = 30.0
"""Lease length in seconds when none is given."""
DEFAULT_NODE_TIMEOUT = 0.05
"""Seconds each node has to answer one command; far below any sensible ttl."""
DEFAULT_RETRY_DELAY = 0.2
"""Mean seconds between attempts of a blocking acquire (jittered ±50%)."""
DEFAULT_DRIFT_FACTOR = 0.01
"""Share of the ttl set aside for clock drift between nodes (the Redlock spec's 0.01)."""
DEFAULT_TIMEOUT = 10.0
"""Seconds a blocking acquire waits when not told: finite, so an unreachable quorum or a
stuck holder surfaces as an error instead of a hung request."""


_L = TypeVar("_L", bound=BaseLease)


class Lease(BaseLease):
    """A held lock: returned by :meth:`LockManager.acquire`, released by :meth:`release`,
    or by leaving its ``with`` block (see :class:`~django_redlock.core.lease.BaseLease` for
    the attributes)."""

    __slots__ = ()
    _manager: LockManager

    def extend(self) -> float:
        """Renew the lease to its full ttl on a quorum; returns the new validity in seconds.

        Keys that hold this lease's token are renewed; a key a node lost (a restart without
        data) is set again there, unless another holder has the name on that node, and counts
        only while the nodes that held the lease can still make a quorum
        (``scripts/extend.lua`` and ``core/flow.judge_extend`` give the rule and why it is
        safe). A key held by anyone else is never touched.

        Raises:
            LeaseReleased: the lease was released.
            LockLost: the lease had ended: its validity ran out (also when the renewal
                finished after it), or a quorum of nodes answered that they no longer hold
                it. It stays lost, and its keys are freed (best effort): everywhere, but for
                a lease found gone only the keys this renewal set again (the others expire by
                themselves; see ``core/flow.lost_clean_up``).
            LeaseNotExtended: neither a quorum renewed it nor a quorum refused it (nodes
                did not answer): nothing changed, the lease keeps the validity it had and
                its keys; try again before ``validity`` runs out.
            LeaseInherited: called in a forked child; nothing is sent to the nodes.
        """
        self._refuse_inherited()
        guard = self._guard
        if guard is None:
            self.check()
            return self._manager._extend(self)
        with guard:  # one renewal at a time, the extender's or ours
            self.check()
            return self._manager._extend(self)

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
        self._refuse_inherited()
        guard = self._guard
        if guard is None:
            if self._end_hold():
                self._manager._release(self)
            return
        with guard:  # a renewal in flight ends first, and none starts after this
            if self._end_hold():
                self._manager._release(self)

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
        return self._manager._owned(self)

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


class _Quarantine:
    """The restart quarantine a manager sends with every acquire, in milliseconds: its own
    ``max_ttl``, raised to the longest any node reports (``scripts/node_rule.lua``).

    Shared with the manager's connections, which report each node's value as they connect
    (:class:`~django_redlock.wire.setup.Hello`), without holding the manager itself.
    """

    __slots__ = ("_lock", "heard", "ms")

    def __init__(self, ms: int) -> None:
        self.ms = ms
        self.heard: set[str] = set()
        self._lock = threading.Lock()  # threads' connections report concurrently

    def report(self, node: str, ms: int) -> None:
        """Node ``node`` has seen quarantines up to ``ms`` (0: none yet)."""
        with self._lock:
            self.heard.add(node)
            self.ms = max(self.ms, ms)


@dataclasses.dataclass(frozen=True)
class _Adoption:
    """An adopt in progress: the handle, the new token, its hand-off round, and the clean-up
    of a failed one (:meth:`undo`). Tokens stay out of its ``repr`` (a traceback's locals, an
    error tracker's frame capture)."""

    handle: LeaseHandle
    token: str = dataclasses.field(repr=False)
    commands: list[Command] = dataclasses.field(repr=False)
    release: list[Command] = dataclasses.field(repr=False)
    hand_back: list[Command] = dataclasses.field(repr=False)
    scope: tuple[object, ...]
    auto_extend: bool
    hold: float | None
    origin: str | None

    def undo(self, error: BaseException) -> list[Command]:
        """The clean-up of an adopt that failed with ``error`` (queued behind the hand-off on
        each node). A quorum refused it (``LockLost``): the lease is gone, so free whatever
        the new token took. Otherwise (too few answers, an interruption) the lease may well
        be alive: hand the keys back to the handle's token, so a lease nobody gave up is not
        deleted and the same handle can be adopted again."""
        return self.release if isinstance(error, LockLost) else self.hand_back


class LockManager:
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

    Raises:
        TypeError, ValueError: a bad argument; the message names it.
    """

    def __init__(
        self,
        nodes: Sequence[object],
        *,
        ttl: float = DEFAULT_TTL,
        node_timeout: float = DEFAULT_NODE_TIMEOUT,
        retry_delay: float = DEFAULT_RETRY_DELAY,
        default_timeout: float | None = DEFAULT_TIMEOUT,
        drift_factor: float = DEFAULT_DRIFT_FACTOR,
        key_prefix: str = "redlock:",
        max_ttl: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] | None = None,
        observer: LockObserver | None = None,
    ) -> None:
        self.addresses: tuple[NodeAddress, ...] = parse_nodes(nodes)
        self.node_timeout = check_seconds(node_timeout, "node_timeout")
        self.retry_delay = check_seconds(retry_delay, "retry_delay")
        self.default_timeout = check_timeout(default_timeout)
        self.drift_factor = check_drift_factor(drift_factor)
        self.key_prefix = check_key_prefix(key_prefix)
        self._clock = clock
        self._sleep = sleep
        self.ttl = check_ttl(ttl, node_timeout=self.node_timeout, drift_factor=self.drift_factor)
        self.max_ttl = check_max_ttl(
            max_ttl, self.ttl, node_timeout=self.node_timeout, drift_factor=self.drift_factor
        )
        self._quarantine = _Quarantine(math.ceil(self.max_ttl * 1000))
        # What every new connection (sync or asyncio) asks its node first (see Hello).
        self._hello = Hello(NODE_KEY, self._quarantine.report)
        self.quorum = len(self.addresses) // 2 + 1
        self._nodes = flow.Nodes(
            tuple(address.label for address in self.addresses),
            self.quorum,
            self.node_timeout,
            self.drift_factor,
            self.retry_delay,
        )
        self._reporter = Reporter(self._nodes, observer)
        self._owners = OwnerRecords(socket.gethostname())
        # Leases by (owner scope, name), for re-entry. The scope names the process, thread
        # and asyncio task, so another thread, task or a forked child is never the owner.
        # Weak values: a lease dropped without release must not be kept alive (and renewed
        # by the extender, which holds leases weakly too) by this registry; it then runs out
        # within its ttl.
        self._held: weakref.WeakValueDictionary[tuple[tuple[object, ...], str], BaseLease] = (
            weakref.WeakValueDictionary()
        )
        # A partial, not a bound method: the connections must not hold the manager, so that a
        # manager dropped without close() is freed by reference counting (no cycle) and its
        # sockets are closed at once rather than whenever the cycle collector runs.
        self._connections = ThreadConnections(
            partial(
                ConnectionSet,
                self.addresses,
                # Network deadlines are real time (poll() waits in real time); the injected
                # clock governs lease arithmetic and retry budgets only.
                clock=time.monotonic,
                max_outstanding=MAX_OUTSTANDING,
                **stall_limits(self.node_timeout),
                preload=HOT_SCRIPTS,
                hello=self._hello,
            )
        )

    @property
    def observer(self) -> LockObserver | None:
        """Told of every acquire, release, renewal, loss and give-up (or None)."""
        return self._reporter.observer

    @property
    def quarantine_ms(self) -> int:
        """The restart quarantine sent with every acquire, in milliseconds: ``max_ttl``,
        raised to the longest any node reports (``scripts/node_rule.lua``)."""
        return self._quarantine.ms

    def __repr__(self) -> str:
        nodes = ", ".join(address.label for address in self.addresses)
        return f"<LockManager quorum {self.quorum} of {len(self.addresses)}: {nodes}>"

    @property
    def nodes(self) -> tuple[str, ...]:
        """The nodes' labels (URLs without passwords)."""
        return self._nodes.labels

    def open_connections(self) -> int:
        """How many node sockets this manager holds open, across all threads."""
        return self._connections.open_count()

    def close(self) -> None:
        """Close every node connection this manager opened (they reopen on demand)."""
        self._connections.close()

    def __enter__(self) -> LockManager:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _validate_ttl(self, ttl: object, argument: str = "ttl") -> float:
        """``ttl`` checked against this manager's limits (:func:`check_ttl`)."""
        return check_ttl(
            ttl,
            argument,
            max_ttl=self.max_ttl,
            node_timeout=self.node_timeout,
            drift_factor=self.drift_factor,
        )

    def key(self, name: str) -> str:
        """The Redis key of lock ``name``."""
        return self.key_prefix + validate_name(name)

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
        name = validate_name(name)
        # Checked first, so a re-entry refuses bad arguments as a first acquire does.
        checked = self._acquire_arguments(ttl, blocking, timeout, auto_extend, max_hold, origin)
        scope = owner_scope()
        held = self._reenter(scope, name, Lease)
        if held is not None:
            return held
        return self._take(name, Shape(self.key_prefix + name), scope, checked)

    def _take(self, name: str, shape: Shape, scope: tuple[object, ...], checked: Checked) -> Lease:
        """Acquire a lease of ``shape`` (a lock, a semaphore slot, a read or write lease,
        several locks), its arguments checked: the Redlock rounds of :meth:`acquire`."""
        connections = self._connections.get()
        if len(self._quarantine.heard) < self.quorum:
            self._first_contact(connections)
        # A blocking acquire waits in a line with one ticket on every node (fair hand-off);
        # a single try never queues, nor does a shape without a line (it polls).
        queues = checked.blocking and shape.wake_key is not None
        # Registered from now on: a release naming it is kept even if it comes while
        # another thread reads the shared pub/sub sockets and this one is not waiting yet.
        waiter = connections.subscriber.waiter_id() if queues else ""
        try:
            attempt = self._begin(name, checked, waiter, shape)
            try:
                return self._rounds(connections, attempt, shape, waiter, scope, checked)
            except BaseException:
                leave = attempt.left_line()
                if leave is not None:
                    # Gave up, or interrupted during a round or a wait (KeyboardInterrupt, a
                    # signal handler raising): leave the line now. A place left behind would
                    # get the next release's wake-up, and the waiters behind it would wait
                    # until it lapses (the asyncio manager does the same on cancellation).
                    connections.post(leave)
                raise
        finally:
            if waiter:
                # Its channel may now be unsubscribed by another thread, once nobody
                # listens on it (the subscriber counts the listeners of each channel).
                connections.subscriber.unregister(waiter)

    def _rounds(
        self,
        connections: ConnectionSet,
        attempt: flow.Acquire,
        shape: Shape,
        waiter: str,
        scope: tuple[object, ...],
        checked: Checked,
    ) -> Lease:
        """The tries of :meth:`_take` until one is granted or the acquire gives up.

        Raises:
            LockNotAcquired: gave up (the caller leaves the line).
        """
        listening = False
        while True:
            commands = attempt.next_round(self._quarantine.ms)
            start = self._clock()
            try:
                exchange = connections.run(
                    commands,
                    self.node_timeout,
                    attempt.decider,
                    attempt.need,
                    identify=True,
                )
                end = self._clock()
            except BaseException:
                # Interrupted (KeyboardInterrupt, a signal handler raising): some SETs may
                # have landed, and nobody else will release them.
                connections.post(attempt.interrupted())
                raise
            step = attempt.judge(exchange.results, exchange.yes, start, end)
            if isinstance(step, flow.Granted):
                strays = attempt.strays(exchange.results)
                if strays is not None:
                    connections.post(strays)
                make = partial(Lease, self)
                free = connections.post
                return self._grant(make, free, attempt, step, exchange.results, scope, checked)
            # Unlock wherever our SET may have landed; pipelined on the same connections as
            # the SETs, so a stalled node applies it after the SET when it wakes up.
            connections.post(step.clean_up)
            error = self._failed(step, checked.origin)
            if error is not None:  # the place in line is left by _take
                raise error
            wake_key = shape.wake_key
            if self._sleep is not None:
                self._sleep(step.delay)  # an injected sleep (tests): a poll, as below
                attempt.waited(False)
            elif not waiter or wake_key is None:
                time.sleep(step.delay)  # nothing wakes a try that never queues: it polls
                attempt.waited(False)
            elif not listening and connections.subscriber.subscribe(
                wake_key, self.node_timeout, waiter
            ):
                # Just subscribed: a release from now on wakes us, and the try right after
                # subscribing covers a release that came between our try and the subscription.
                listening = True
            else:
                # Listening since before our last try (the channel was kept from an earlier
                # wait, of this thread or another): any release since then was published to
                # us, and kept for us whichever thread read it.
                listening = True
                attempt.waited(connections.subscriber.wait(waiter, step.delay))

    def _first_contact(self, connections: ConnectionSet) -> None:
        """Hear from the nodes before the first acquire: one round trip (bounded by the node
        timeout), repeated until a quorum has answered once.

        Each new connection learns its node's server process and persistence, and the
        longest quarantine the node has seen (see ``Hello``): a node that restarted forgot
        it, so the others must tell this manager before its first acquire reaches that node
        (``scripts/node_rule.lua``).
        """
        size = len(self.addresses)
        # Done at a quorum of answers: the rest report as their connections come up.
        connections.run([PING] * size, self.node_timeout, b"PONG", self.quorum)

    # -- what both managers share around the rounds: the asyncio manager calls these too.

    def _reenter(self, scope: tuple[object, ...], name: str, kind: type[_L]) -> _L | None:
        """The lease of type ``kind`` that ``scope`` already holds on ``name``, counted once
        more (re-entry by the same thread or asyncio task), or None."""
        held = self._held.get((scope, name))
        if isinstance(held, kind) and not held.released and not held.lost:
            held._depth += 1
            return held
        return None

    def _begin(self, name: str, checked: Checked, waiter: str, shape: Shape) -> flow.Acquire:
        """The flow of a new acquire of ``name`` as ``shape`` (sync and asyncio alike)."""
        owner = self._owners.record(checked.origin)
        started = self._clock()
        wait = checked.wait
        return flow.Acquire(
            self._nodes,
            name,
            self.key_prefix + name,
            checked.ttl,
            owner,
            checked.blocking,
            started,
            None if (checked.blocking and wait is None) else started + (wait or 0.0),
            waiter,
            # The place in line: the same number on every node (this first try, in µs).
            time.time_ns() // 1000,
            # A place lapses after a few polls without a try (see flow.retry_delay).
            math.ceil(max(1.0, 4 * self.retry_delay) * 1000),
            shape=shape,
        )

    def _grant(
        self,
        make: Callable[..., _L],
        free: Callable[[list[Command | None]], None],
        attempt: flow.Acquire,
        granted: flow.Granted,
        results: Sequence[Any],
        scope: tuple[object, ...],
        checked: Checked,
    ) -> _L:
        """The lease a round of ``attempt`` won, made by ``make`` (``Lease`` or
        ``AsyncLease`` bound to its manager) and its owner's: reported, registered for
        re-entry, renewed if asked. If that raises, the caller never gets the lease (``_own``
        let it go): its keys are freed by ``free`` (the manager's send-without-waiting)."""
        try:
            lease = make(
                name=attempt.name,
                key=attempt.key,
                token=granted.token,
                ttl=attempt.ttl,
                expires_at=granted.expires_at,
                acquired_at=granted.acquired_at,
                origin=checked.origin,
                shape=attempt.kind,
            )
            lease._owner = attempt.owner
            lease._held = held_on(attempt.kind.granted_on(results))
            waited = lease.acquired_at - attempt.started
            self._reporter.granted(lease.name, results, attempt.votes, waited)
            # Our place in line may remain on nodes that did not grant this attempt; the
            # release drops it there (see release.lua), at no extra round trip.
            lease._waiter = attempt.waiter
            return self._own(lease, scope, checked.auto_extend, checked.hold, waited)
        except BaseException:
            free(attempt.interrupted())
            raise

    def _own(
        self,
        lease: _L,
        scope: tuple[object, ...],
        auto_extend: bool,
        hold: float | None,
        waited: float,
    ) -> _L:
        """Make ``lease`` its owner's (acquired or adopted, sync or asyncio): registered for
        re-entry, renewed if asked, reported.

        If this raises (an observer's error, a signal handler raising), the caller never
        gets the lease: it is let go here first (no renewal, no re-entry), and the caller
        frees or hands back its keys.
        """
        try:
            if auto_extend:
                lease._guard = threading.Lock()
                if hold is not None:
                    lease._renew_until = time.monotonic() + hold
                extender.schedule(lease, time.monotonic() + lease.ttl / 3)
            lease._scope = scope
            if lease._shape.reentrant:
                self._held[(scope, lease.name)] = lease
            self._reporter.acquired(lease, waited)
        except BaseException:
            # Else a re-entrant acquire in this thread would get a lease whose keys are
            # being freed, and the extender would keep renewing them.
            lease._released = True
            self._forget_owner(lease)
            raise
        return lease

    def _failed(self, step: flow.Failed, origin: str | None) -> LockNotAcquired | None:
        """Report a failed attempt (sync and asyncio alike); returns the error to raise when
        the acquire gives up, else None (it tries again)."""
        self._reporter.attempt_failed(step.error)
        if not step.give_up:
            return None
        return self._reporter.gave_up(step.error, origin, step.waited)

    def _forget_owner(self, lease: BaseLease) -> None:
        if lease._scope is not None and self._held.get((lease._scope, lease.name)) is lease:
            del self._held[(lease._scope, lease.name)]

    def _acquire_arguments(
        self,
        ttl: object,
        blocking: object,
        timeout: object,
        auto_extend: object,
        max_hold: object,
        origin: object,
    ) -> Checked:
        """Check ``acquire``'s arguments (sync and asyncio alike); returns them checked.

        Raises:
            TypeError, ValueError: a bad argument; the message names it.
        """
        seconds = self.ttl if ttl is None else self._validate_ttl(ttl)
        if not isinstance(blocking, bool):
            raise TypeError(f"blocking must be a bool, not {type(blocking).__name__}")
        if timeout is MANAGER_DEFAULT:
            wait = self.default_timeout if blocking else None
        else:
            wait = None if timeout is None else check_seconds(timeout, "timeout", allow_zero=True)
        if not blocking and wait:
            raise ValueError("timeout must be None or 0 when blocking=False")
        if not isinstance(auto_extend, bool):
            raise TypeError(f"auto_extend must be a bool, not {type(auto_extend).__name__}")
        hold = None if max_hold is None else check_seconds(max_hold, "max_hold")
        if hold is not None and not auto_extend:
            raise ValueError("max_hold only applies with auto_extend=True")
        if origin is not None and not isinstance(origin, str):
            raise TypeError(f"origin must be a str, not {type(origin).__name__}")
        return Checked(seconds, blocking, wait, auto_extend, hold, clip_origin(origin))

    # -- release, extend and the questions a lease asks ------------------------------------

    def _release(self, lease: BaseLease) -> None:
        connections = self._connections.get()
        expired = lease._expires_at <= self._clock()
        # Queued behind whatever a node still owes, never skipped: a node that owes many
        # replies (it stalled, or was overloaded while this thread waited) then frees the
        # lock when it catches up instead of keeping the key for the whole ttl.
        exchange = connections.run(
            flow.release_round(len(self.addresses), lease._shape, lease.token, lease._waiter),
            self.node_timeout,
            lease._shape.release_yes,
            self.quorum,
            queue_behind=True,
        )
        lease._settle_release(exchange.results, exchange.yes, expired)

    def _extend(self, lease: BaseLease) -> float:
        """One renewal round of ``lease`` (its owner's, or the extender thread's for sync
        and asyncio leases alike); the new validity in seconds.

        Raises:
            LockLost: the lease ended (its validity ran out, or a quorum no longer holds it);
                its keys are then freed, best effort (compare-and-delete: only ours), as
                :func:`~django_redlock.core.flow.lost_clean_up` says.
            LeaseNotExtended: no quorum either way; nothing is freed: the lease keeps its
                validity, and its keys keep others out until it runs out.
        """
        connections = self._connections.get()
        size = len(self.addresses)
        if lease._expired_before_renewal():
            connections.post(lease._shape.clean_up(lease.token, None, size))
            raise lease._lost_error()
        commands = self._extend_round(lease)
        start = self._clock()
        # Never given up early on refusals: a node that never held the lease may answer
        # "set again" (2) without any loss, so only every answer (or the deadline) decides.
        exchange = connections.run(commands, self.node_timeout, 1, self.quorum, give_up=size)
        now = self._clock()
        try:
            return lease._settle_extend(start, now, exchange.results)
        except LockLost:
            # The lease has ended: free what keys of ours only keep the next holder waiting
            # (flow.lost_clean_up: all of them, but for a lease found gone only those this
            # round re-created). Never on a mere miss: those keys keep others out meanwhile.
            connections.post(
                flow.lost_clean_up(lease._shape, lease.token, lease._lost_cause, exchange.results)
            )
            raise

    def _extend_round(self, lease: BaseLease) -> list[Command]:
        """The commands of a renewal round of ``lease`` (sync and asyncio alike): renew, or
        re-create where a node lost the key (with ``lease``'s owner record)."""
        if not lease._owner:
            lease._owner = self._owners.record(lease.origin)
        size = len(self.addresses)
        return flow.extend_round(size, lease._shape, lease.token, lease.ttl, lease._owner)

    def _owned(self, lease: BaseLease) -> bool:
        """One round trip: does a quorum hold ``lease``'s token (sync ``Lease.owned``)."""
        exchange = self._connections.get().run(
            flow.owns_round(len(self.addresses), lease._shape, lease.token),
            self.node_timeout,
            1,
            self.quorum,
        )
        return flow.owned(self._nodes, exchange.yes, lease.validity)

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
            auto_extend, max_hold, origin: as for :meth:`acquire`.

        Raises:
            LockLost: the lease ran out, was released or adopted elsewhere: there is nothing
                to take over.
            QuorumUnreachable: too few nodes answered to take it over; the keys are handed
                back, so the same handle can be adopted again while its lease lasts.
            TypeError, ValueError: not a handle, or one for another key prefix.
        """
        adoption = self._adoption(handle, auto_extend, max_hold, origin)
        connections = self._connections.get()
        if len(self._quarantine.heard) < self.quorum:
            self._first_contact(connections)
        size = len(self.addresses)
        start = self._clock()
        try:
            exchange = connections.run(
                adoption.commands,
                self.node_timeout,
                flow.NEVER_YES,
                size,
                give_up=size - 1,
                identify=True,
            )
            return self._adopted(partial(Lease, self), adoption, exchange.results, start)
        except BaseException as error:
            # Refused, unanswered or interrupted: nobody holds the new token.
            connections.post(adoption.undo(error))
            raise

    def _adoption(
        self, handle: object, auto_extend: object, max_hold: object, origin: object
    ) -> _Adoption:
        """Check an adopt's arguments and build its round (sync and asyncio alike)."""
        taken = as_handle(handle)
        if taken.key != self.key_prefix + taken.name:
            raise ValueError(
                f"handle is for another manager's key prefix (this one's is {self.key_prefix!r})"
            )
        try:
            self._validate_ttl(taken.ttl)
        except ValueError as error:
            # The handle's ttl, not one the caller gave: e.g. above this manager's max_ttl.
            message = f"handle: its lease's ttl does not fit this manager: {error}"
            raise ValueError(message) from None
        checked = self._acquire_arguments(taken.ttl, False, None, auto_extend, max_hold, origin)
        extend, hold, text = checked.auto_extend, checked.hold, checked.origin
        size = len(self.addresses)
        token = secrets.token_hex(20)
        owner = self._owners.record(text)
        return _Adoption(
            taken,
            token,
            flow.handoff_round(size, taken.key, taken.token, token, owner, self._quarantine.ms),
            flow.release_round(size, Shape(taken.key), token),
            flow.handback_round(size, taken.key, token, taken.token, self._quarantine.ms),
            owner_scope(),
            extend,
            hold,
            text,
        )

    def _adopted(
        self,
        make: Callable[..., _L],
        adoption: _Adoption,
        results: Sequence[Any],
        start: float,
    ) -> _L:
        """The lease a hand-off round sent at ``start`` gave (sync and asyncio alike).

        Raises:
            LockLost: refused by a quorum, or nothing left of the lease's validity.
            QuorumUnreachable: too few nodes answered to tell.
        """
        end = self._clock()
        taken = adoption.handle
        outcome = flow.judge_adopt(self._nodes, taken.name, taken.ttl, results, end - start)
        if isinstance(outcome, str):
            raise LockLost(taken.name, outcome)
        if isinstance(outcome, QuorumUnreachable):
            raise outcome
        lease = make(
            name=taken.name,
            key=taken.key,
            token=adoption.token,
            ttl=taken.ttl,
            expires_at=end + outcome,
            acquired_at=end,
            origin=adoption.origin,
        )
        lease.fencing_token = taken.fencing_token
        lease._held = held_on(type(reply) is int and reply > 0 for reply in results)
        self._reporter.adopted(lease)
        return self._own(lease, adoption.scope, adoption.auto_extend, adoption.hold, end - start)

    def locked(self, name: str) -> bool:
        """Whether lock ``name`` is held on a quorum of the nodes now (one round trip, by
        anyone; see :meth:`holder` for who).

        Raises:
            TypeError, ValueError: a bad name.
        """
        return flow.is_locked(self._nodes, self.holder(name))

    def holder(self, name: str) -> dict[str, Any] | None:
        """Who holds lock ``name``, from the owner metadata stored with it, or None.

        Returns the owner dict (host, pid, thread, task, origin, acquired_at as epoch
        seconds) as found on most nodes that answered, plus ``nodes`` (how many hold it) and
        ``ttl`` (the longest remaining seconds among them). Never the token.

        Raises:
            TypeError, ValueError: a bad name.
        """
        size = len(self.addresses)
        exchange = self._connections.get().run(  # every node's answer is wanted
            flow.holder_round(size, self.key(name)),
            self.node_timeout,
            None,
            size,
            give_up=size,
        )
        return flow.holder_of(exchange.results)

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

    # -- beyond a lock: semaphores, read-write locks, several locks at once ----------------

    def semaphore(self, name: str, limit: int) -> Semaphore[Lease]:
        """The semaphore ``name`` of ``limit`` slots: ``.acquire(...)`` returns a lease of one
        slot; at most ``limit`` such leases are valid at any moment, cluster-wide (see
        :class:`~django_redlock.core.kinds.Semaphore`). Every user of one semaphore must give
        the same ``limit``.

        Raises:
            TypeError, ValueError: a bad name or limit (1 … 1024).
        """
        return Semaphore(self, validate_name(name), limit)

    def rwlock(self, name: str) -> RWLock[Lease]:
        """The read-write lock ``name``: ``.read(...)`` and ``.write(...)`` return leases
        (see :class:`~django_redlock.core.kinds.RWLock`).

        Raises:
            TypeError, ValueError: a bad name.
        """
        return RWLock(self, validate_name(name))

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
        checked = validate_names(names)
        shape = Many([self.key_prefix + name for name in checked])
        lease = self._take_shape(" + ".join(checked), shape, dict(options))
        lease.names = tuple(checked)
        return lease

    def _take_shape(self, name: str, shape: Shape, options: dict[str, Any]) -> Lease:
        """Acquire a lease of ``shape`` with ``acquire``'s keyword ``options`` (never
        re-entrant)."""
        checked = self._acquire_arguments(*acquire_options(options))
        return self._take(name, shape, owner_scope(), checked)

    # -- operators -------------------------------------------------------------------------

    def locks(self, prefix: str = "", *, limit: int | None = 1000) -> LockListing:
        """The active locks whose names start with ``prefix``, merged across the nodes: a
        :class:`~django_redlock.core.listing.LockListing` of the first ``limit`` by name
        (None: all of them), with how many it did not show (never the tokens). The cap only
        chooses which locks are shown; each shown lock's node count is read on every node.

        Raises:
            TypeError, ValueError: a bad ``prefix`` or ``limit`` (an int of 1 or more, or
                None).
        """
        return list_locks(self, prefix, limit=limit)

    def force_release(self, name: str) -> int:
        """Delete lock ``name`` on every node, whoever holds it; returns how many nodes had
        it. For operators: the evicted holder is not told, so pair it with a fencing token
        bump (the admin page does) wherever writes must be refused.

        Raises:
            TypeError, ValueError: a bad name.
        """
        size = len(self.addresses)
        exchange = self._connections.get().run(
            flow.force_release_round(size, self.key(name)),
            self.node_timeout,
            1,
            size,
            give_up=size,
        )
        deleted: int = exchange.yes
        self._reporter.force_released(name, deleted)
        return deleted

    def declare_fresh(self, nodes: Iterable[str] | None = None) -> list[Any]:
        """Let the current server process of every node (or of ``nodes``, given by label or
        URL) vote at once, with no restart quarantine, until it restarts.

        Only for brand-new nodes, or nodes shut down cleanly with their data: on a node that
        lost locks whose leases still run, it allows a double grant. The declaration names the
        node's run_id, so a later restart (empty, from a snapshot) is quarantined again.

        Returns one :class:`~django_redlock.core.health.Declaration` per node (what was done).

        Raises:
            ValueError: ``nodes`` names a node this manager does not have.
            RedlockError: a node could not be declared (unreachable, refused).
        """
        addresses = self.addresses_of(nodes)
        done = declare_fresh(addresses, timeout=max(self.node_timeout, 1.0))
        failed = [item for item in done if not item.declared]
        if failed:
            raise RedlockError("; ".join(f"{item.node}: {item.detail}" for item in failed))
        return done

    def addresses_of(self, nodes: Iterable[str] | None) -> tuple[NodeAddress, ...]:
        """This manager's nodes named in ``nodes`` (labels or URLs; all when None).

        Raises:
            ValueError: a name matches none of them.
        """
        if nodes is None:
            return self.addresses
        if isinstance(nodes, str):
            raise TypeError("nodes must be a list of node URLs, not a single str")
        wanted = list(nodes)
        picked = []
        for name in wanted:
            identity = parse_node(name).identity if "://" in name else None
            matches = [
                address
                for address in self.addresses
                if address.label == name or address.identity == identity
            ]
            if not matches:
                known = ", ".join(address.label for address in self.addresses)
                raise ValueError(f"nodes: {name!r} is not one of this manager's nodes ({known})")
            picked.extend(matches)
        return tuple(picked)
