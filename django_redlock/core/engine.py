"""The one engine both managers hold: :class:`Engine`.

:class:`~django_redlock.redlock.LockManager` (sync) and
:class:`~django_redlock.aredlock.AsyncLockManager` (asyncio) each only carry out their kind
of I/O; what they share lives here, once: the configuration and the nodes, the restart
quarantine and what each new connection asks first (the hello), the reporter and its
observer, the owner records, the re-entry registry, and the steps around a round (argument
checks, re-entry, begin, grant, own, give up, adopt). Two managers built on one engine
(``AsyncLockManager.sharing(sync)``) share all of it: one owner per lease whichever kind of
code took it.

The engine is also the host of both lease types (:class:`~django_redlock.core.lease.LeaseHost`):
their clock, reporter and nodes, and the *sync* renewal round that the extender thread runs
for sync and asyncio leases alike. So it holds the sync transport
(``wire.sync.connections``), which the sync manager's rounds use too; the asyncio manager keeps
its own per-loop connections.

It imports no Django and neither manager module.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import random
import secrets
import socket
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from types import ModuleType
from typing import Any, Protocol, TypeVar

from django_redlock.core.handle import LeaseHandle, as_handle
from django_redlock.core.health import declare_fresh
from django_redlock.core.lease import (
    BaseLease,
    cycle_free,
    expired_before_renewal,
    forget_in,
    held_on,
    let_go,
    lost_clean_up,
    lost_error,
    owns_round,
    reenter,
    release_round,
    renewal_basis,
    renewal_lost,
    renewal_missed,
    renewal_round,
    renewed,
    settle_grant,
    settle_release,
    take_over,
)
from django_redlock.core.owner import OwnerRecords, owner_scope
from django_redlock.core.reentry import Reentry
from django_redlock.core.reporting import LockObserver, Reporter
from django_redlock.core.witness import CLIENT_SEEN, VoteRecorder
from django_redlock.exceptions import LockLost, QuorumUnreachable, RedlockError
from django_redlock.procedures import flow
from django_redlock.procedures.arguments import (
    check_drift_factor,
    check_key_prefix,
    check_max_ttl,
    check_seconds,
    check_timeout,
    check_ttl,
    clip_origin,
    validate_name,
)
from django_redlock.procedures.lease import extend, owned
from django_redlock.procedures.options import MANAGER_DEFAULT, Checked
from django_redlock.procedures.shapes import Shape, heard
from django_redlock.wire.nodes import NodeAddress, parse_node, parse_nodes
from django_redlock.wire.primitives import PRELOAD
from django_redlock.wire.scripts import NODE_KEY, PING, Command
from django_redlock.wire.servers import Servers
from django_redlock.wire.setup import Hello
from django_redlock.wire.stall import MAX_OUTSTANDING, stall_limits
from django_redlock.wire.sync.connections import ConnectionSet, ThreadConnections
from django_redlock.wire.sync.driver import drive

__all__ = [
    "DEFAULT_DRIFT_FACTOR",
    "DEFAULT_NODE_TIMEOUT",
    "DEFAULT_RETRY_DELAY",
    "DEFAULT_TIMEOUT",
    "DEFAULT_TTL",
    "Adoption",
    "Engine",
    "Quarantine",
    "Sharing",
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

logger = logging.getLogger("django_redlock")


class Quarantine:
    """The restart quarantine a manager sends with every acquire, in milliseconds: its own
    ``max_ttl``, raised to the longest any node reports (``scripts/node_rule.lua``).

    Shared with the engine's connections, sync and asyncio, which report each node's value
    as they connect (:class:`~django_redlock.wire.setup.Hello`), without holding the engine.
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


_ENGINES: weakref.WeakSet[Engine] = weakref.WeakSet()
"""Every engine of this process, for :func:`_after_fork_in_child`."""


def _after_fork_in_child() -> None:
    # A child inherits its parent's engines with every node already recorded, but not the
    # recorder's thread: its own first grants must be recorded again, or the records would
    # only be refreshed while the parent lives (a prefork server's parent may exit).
    # Their locks may have been copied held by a thread of the parent's (a fork while it
    # reported a hello, or took the recorder's snapshot): made anew, as a fork requires.
    for engine in list(_ENGINES):
        engine._unrecorded = set(range(len(engine.addresses)))
        engine._voters.after_fork_in_child()
        engine.servers.after_fork_in_child()
        engine.quarantine._lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


@dataclasses.dataclass(frozen=True)
class Adoption:
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


class Sharing(Protocol):
    """A manager whose engine another one can share (``sharing(manager)``): either kind."""

    @property
    def engine(self) -> Engine: ...


_ATOMS = (str, int, float, bool, bytes, type(None))
_ADDRESS_FIELDS = tuple(field.name for field in dataclasses.fields(NodeAddress))
_BUILTIN = type(time.monotonic)


def reaches_no_lease(
    addresses: Sequence[NodeAddress], clock: object, observer: object, key_prefix: object
) -> bool:
    """Whether an engine built from these refers to nothing of the user's that could refer
    back to a lease (an allow-list: anything not known to be closed counts as open).

    Every held lease refers to its engine, so a lease may be untracked by the garbage
    collector (``core.lease._cycle_free``) only if no path leads from the engine back to it.
    The engine's own objects hold leases weakly or not at all; what the user gave it is
    closed only if: each node address holds plain strings, numbers, bools and None (no
    redis-py ``CredentialProvider``, no object among the TLS options), the key prefix is a
    plain ``str``, the clock is a builtin function of a module (the default
    ``time.monotonic``: an injected clock may be a method of anything), and the observer is
    None or its own class says ``keeps_leases = False`` (the Django layer's
    ``SignalObserver``: no ``__dict__``, its manager held weakly)."""
    if type(clock) is not _BUILTIN or not isinstance(getattr(clock, "__self__", None), ModuleType):
        return False
    if observer is not None and type(observer).__dict__.get("keeps_leases") is not False:
        return False
    if type(key_prefix) is not str:
        return False
    for address in addresses:
        for name in _ADDRESS_FIELDS:
            value = getattr(address, name)
            if type(value) is tuple:  # ssl_options: (name, value) pairs
                if any(type(item) not in _ATOMS for pair in value for item in pair):
                    return False
            elif type(value) not in _ATOMS:
                return False
    return True


class Engine:
    """What the sync and the asyncio manager share (see the module docstring).

    Takes the arguments of :class:`~django_redlock.redlock.LockManager` but ``sleep`` (how
    to wait is the manager's business). Times are seconds.

    Raises:
        TypeError, ValueError: a bad argument; the message names it.
    """

    # Slots, no __dict__: every held lease refers to its engine, and a thread's leases are
    # untracked by the garbage collector while held (core.lease._cycle_free), which is safe
    # only while nothing the engine reaches can be made to refer back to a lease. Code handed
    # the engine (a signal's sender when its observer has no manager, ``lease.host``) cannot
    # hang anything on it.
    __slots__ = (
        "__weakref__",
        "_contact",
        "_default_checks",
        "_line_lifetime_ms",
        "_unrecorded",
        "_voters",
        "addresses",
        "clock",
        "connections",
        "default_timeout",
        "drift_factor",
        "held",
        "hello",
        "key_prefix",
        "leases_untrackable",
        "max_ttl",
        "node_timeout",
        "nodes",
        "owners",
        "quarantine",
        "quorum",
        "reporter",
        "retry_delay",
        "servers",
        "ttl",
    )

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
        observer: LockObserver | None = None,
    ) -> None:
        self.addresses: tuple[NodeAddress, ...] = parse_nodes(nodes)
        self.node_timeout = check_seconds(node_timeout, "node_timeout")
        self.retry_delay = check_seconds(retry_delay, "retry_delay")
        self.default_timeout = check_timeout(default_timeout)
        self.drift_factor = check_drift_factor(drift_factor)
        self.key_prefix = check_key_prefix(key_prefix)
        self.clock = clock
        """The monotonic clock (seconds) of lease validity and retry budgets; network
        deadlines always use real time."""
        self.ttl = check_ttl(ttl, node_timeout=self.node_timeout, drift_factor=self.drift_factor)
        self.max_ttl = check_max_ttl(
            max_ttl, self.ttl, node_timeout=self.node_timeout, drift_factor=self.drift_factor
        )
        self.quarantine = Quarantine(math.ceil(self.max_ttl * 1000))
        # What every new connection (sync or asyncio) asks its node first (see Hello).
        self.servers = Servers([address.label for address in self.addresses])
        self.hello = Hello(
            NODE_KEY, self.quarantine.report, self.servers.report, self.servers.twins
        )
        self.quorum = len(self.addresses) // 2 + 1
        self.nodes = flow.Nodes(
            tuple(address.label for address in self.addresses),
            self.quorum,
            self.node_timeout,
            self.drift_factor,
            self.retry_delay,
            any(address.replica_acks for address in self.addresses),
        )
        self.reporter = Reporter(self.nodes, observer)
        self.owners = OwnerRecords(socket.gethostname())
        # acquire()'s arguments checked once for the default options, single try or
        # blocking: they depend only on this configuration, which never changes (see
        # check_arguments).
        self._default_checks = {
            blocking: Checked(
                self.ttl, blocking, self.default_timeout if blocking else None, False, None, None
            )
            for blocking in (False, True)
        }
        # One per engine, never changed: the first contact allocates nothing per acquire.
        self._contact = flow.Contact([PING] * len(self.addresses), self.quorum)
        # A place in line lapses after a few polls without a try (see flow.retry_delay).
        self._line_lifetime_ms = math.ceil(max(1.0, 4 * self.retry_delay) * 1000)
        self.held: Reentry[BaseLease] = Reentry(cycle_free)
        """Leases by (owner scope, name), for re-entry (weak references: see :meth:`own`).
        The scope names the process, thread and asyncio task, so another thread, task or a
        forked child is never the owner. Weak values: a lease dropped without release must
        not be kept alive (and renewed by the extender, which holds leases weakly too) by
        this registry; it then runs out within its ttl, and its entry goes."""
        # A partial, not a bound method: the connections must not hold the engine, so that
        # an engine dropped without close() is freed by reference counting (no cycle) and
        # its sockets are closed at once rather than whenever the cycle collector runs.
        self.connections = ThreadConnections(
            partial(
                ConnectionSet,
                self.addresses,
                # Network deadlines are real time (poll() waits in real time); the injected
                # clock governs lease arithmetic and retry budgets only.
                clock=time.monotonic,
                max_outstanding=MAX_OUTSTANDING,
                **stall_limits(self.node_timeout),
                preload=PRELOAD,
                hello=self.hello,
            )
        )
        """The sync transport, one connection set per thread: the sync manager's rounds and
        every lease's renewal by the extender thread (sync or asyncio lease)."""
        self._voters = VoteRecorder(self.addresses, timeout=max(self.node_timeout, 1.0))
        self._unrecorded = set(range(len(self.addresses)))
        _ENGINES.add(self)  # a forked child records its own votes (see _after_fork_in_child)
        """The nodes this process has not seen grant yet: the first grant of each is recorded
        on the other nodes (``core/witness.py``), so that ``redlock_declare_fresh`` never takes
        a node that voted, crashed and came back empty for a brand-new one."""
        self.leases_untrackable = reaches_no_lease(self.addresses, clock, observer, key_prefix)
        """Whether nothing of the user's that this engine refers to can refer to a lease, so
        that a thread holding many of its sync leases may have them untracked by the garbage
        collector (``core.lease._cycle_free``): fixed at construction, from what it was given."""

    def _one_vote_per_server(
        self, attempt: flow.Acquire | flow.FirstTry, held: Sequence[bool], results: Sequence[Any]
    ) -> None:
        """Count the grants of two addresses of one server as one vote: a quorum must be of
        different servers, or the lease is refused (the caller frees its keys). Only grants
        heard count here (``held`` also has the nodes whose reply was not waited for).

        Raises:
            QuorumUnreachable: the grants come from fewer servers than a quorum; its node
                errors name each address and the one it duplicates.
        """
        labels = self.nodes.labels
        granted = [may and heard(reply) for may, reply in zip(held, results, strict=True)]
        servers = self.servers.distinct(labels, granted)
        if servers >= self.quorum:
            return
        same = dict(self.servers.same)
        raise QuorumUnreachable(
            attempt.name,
            servers,
            self.quorum,
            {
                label: f"same server as {first} (one run_id): not an independent node; list "
                "each Redlock node once, on its own server"
                for label, first in same.items()
            },
        )

    def _record_votes(self, held: Sequence[bool]) -> None:
        """Hand the nodes in ``held`` not seen granting before to the vote recorder (a dict
        lookup each; its thread writes the records, never this one)."""
        for index, granted in enumerate(held):
            if granted and index in self._unrecorded:
                self._unrecorded.discard(index)
                self._voters.saw_vote(self.addresses[index], CLIENT_SEEN)

    def __repr__(self) -> str:
        return f"<Engine quorum {self.quorum} of {len(self.addresses)}: {self.describe()}>"

    def describe(self) -> str:
        """The nodes' labels, comma-separated (for the managers' ``repr``)."""
        return ", ".join(self.nodes.labels)

    @property
    def observer(self) -> LockObserver | None:
        """Told of every acquire, release, renewal, loss and give-up (or None)."""
        return self.reporter.observer

    def close(self) -> None:
        """Close the sync connections (they reopen on demand)."""
        self.connections.close()

    # -- operators (both managers' ``declare_fresh`` and ``addresses_of``) -------------------

    def declare_fresh(self, nodes: Iterable[str] | None = None) -> list[Any]:
        """Let the current server process of every node (or of ``nodes``) vote at once,
        with no restart quarantine, until it restarts (see ``LockManager.declare_fresh``).
        Blocking I/O through clients of its own, one per node.

        Raises:
            ValueError: ``nodes`` names a node this engine does not have.
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

    # -- arguments -----------------------------------------------------------------------

    def validate_ttl(self, ttl: object, argument: str = "ttl") -> float:
        """``ttl`` checked against this engine's limits (:func:`check_ttl`).

        Raises:
            TypeError, ValueError: not a number of seconds within the limits.
        """
        return check_ttl(
            ttl,
            argument,
            max_ttl=self.max_ttl,
            node_timeout=self.node_timeout,
            drift_factor=self.drift_factor,
        )

    def key(self, name: str) -> str:
        """The Redis key of lock ``name``.

        Raises:
            TypeError, ValueError: a bad name.
        """
        return self.key_prefix + validate_name(name)

    def check_arguments(
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
        if (
            ttl is None
            and timeout is MANAGER_DEFAULT
            and auto_extend is False
            and max_hold is None
            and origin is None
            and (blocking is True or blocking is False)
        ):
            # Every option left at its default: the answer the checks below give for it,
            # built once (a test runs both and compares).
            return self._default_checks[blocking]
        seconds = self.ttl if ttl is None else self.validate_ttl(ttl)
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

    # -- the steps of an acquire, around its rounds ----------------------------------------

    def contact(self) -> flow.Contact | None:
        """The first contact to carry out before an acquire or adopt begins (see
        :class:`~django_redlock.procedures.flow.Contact`), or None once a quorum has been heard."""
        if len(self.quarantine.heard) < self.quorum:
            return self._contact
        return None

    def reenter(self, scope: tuple[object, ...], name: str, kind: type[_L]) -> _L | None:
        """The lease of type ``kind`` that ``scope`` already holds on ``name``, counted once
        more (re-entry by the same thread or asyncio task), or None."""
        held = self.held.get(scope, name)
        if held is not None and reenter(held, kind):
            return held
        return None

    def first_try(self, name: str, checked: Checked, waiter: str, shape: Shape) -> flow.FirstTry:
        """The first round of a new acquire of ``name`` as ``shape`` (sync and asyncio alike),
        built without its flow (see :class:`~django_redlock.procedures.flow.FirstTry`): it starts
        now on the engine's clock, so what came before (the first contact) does not count
        against its timeout."""
        return flow.FirstTry(
            self.nodes,
            name,
            self.key_prefix + name,
            shape,
            checked.ttl,
            self.owners.record(checked.origin),
            checked.blocking,
            self.clock(),
            waiter,
            # The place in line: the same number on every node (this first try, in µs).
            time.time_ns() // 1000,
            self._line_lifetime_ms,
            self.quarantine.ms,
        )

    # The retry jitter of an acquire's flow (procedures.acquire.resume).
    uniform = staticmethod(random.uniform)

    def begin(
        self, name: str, checked: Checked, waiter: str, shape: Shape, listens: bool = True
    ) -> flow.Acquire:
        """The flow of a new acquire of ``name`` as ``shape`` (sync and asyncio alike); it
        starts now on the engine's clock, so what came before (the first contact) does not
        count against its timeout. ``listens``: the manager hears releases (see
        :class:`~django_redlock.procedures.flow.Acquire`). The managers start with
        :meth:`first_try` instead, and come here through :meth:`resume`."""
        owner = self.owners.record(checked.origin)
        started = self.clock()
        wait = checked.wait
        return flow.Acquire(
            self.nodes,
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
            self._line_lifetime_ms,
            shape=shape,
            listens=listens,
        )

    def grant(
        self,
        make: Callable[..., _L],
        attempt: flow.Acquire | flow.FirstTry,
        acquired_at: float,
        expires_at: float,
        results: Sequence[Any],
        scope: tuple[object, ...],
        checked: Checked,
    ) -> _L:
        """The lease a round of ``attempt`` won (its
        :class:`~django_redlock.procedures.flow.Granted` times, on the engine's clock: taken at
        ``acquired_at``, valid until ``expires_at``),
        made by ``make`` (``Lease`` or ``AsyncLease`` bound to its manager) and its owner's:
        reported, registered for re-entry, renewed if asked. If that raises, the caller never
        gets the lease (:meth:`own` let it go); the acquire procedure frees its keys."""
        shape = attempt.shape
        assert shape is not None
        # What settle_grant would record, given to the lease as it is made. Our place in
        # line may remain on nodes that did not grant this attempt; the release drops it
        # there (see release.lua), at no extra round trip.
        held = held_on(shape.granted_on(results))
        if self.servers.same:  # empty unless two addresses reached one server
            self._one_vote_per_server(attempt, held, results)
        # By position, in BaseLease's order (name, key, token, ttl, expires_at, acquired_at,
        # origin, shape, owner, waiter, held): keyword arguments cost more (see there).
        lease = make(
            attempt.name,
            attempt.key,
            attempt.token,
            attempt.ttl,
            expires_at,
            acquired_at,
            checked.origin,
            shape,
            attempt.owner,
            attempt.waiter,
            held,
        )
        waited = acquired_at - attempt.started
        self.reporter.granted(attempt.name, results, attempt.votes, waited)
        if self._unrecorded:  # empty until every node was seen granting
            self._record_votes(held)
        return self.own(lease, scope, checked.auto_extend, checked.hold, waited)

    def own(
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
            take_over(lease, scope, auto_extend, hold, self.held)
            reporter = self.reporter
            if reporter.observer is not None:  # nobody listens, usually: no call then
                reporter.acquired(lease, waited)
        except BaseException:
            # Else a re-entrant acquire in this thread would get a lease whose keys are
            # being freed, and the extender would keep renewing them.
            let_go(lease)
            self.forget(lease)
            raise
        return lease

    def round_failed(self, attempt: flow.Acquire, step: flow.Failed) -> None:
        """Report the failed round ``step`` of ``attempt`` (sync and asyncio alike)."""
        self.reporter.attempt_failed(step.error)

    def gave_up(self, step: flow.Failed, origin: str | None) -> None:
        """Report an acquire (of ``origin``) that gives up after its failed round ``step``."""
        self.reporter.gave_up(step.error, origin, step.waited)

    def learn_quarantine(self, node: str, ms: int) -> None:
        """Take the longer quarantine ``ms`` that ``node`` refused a vote for (see
        ``procedures.acquire.learn_quarantines``): every later acquire sends the longest.
        Logged, since it means the processes that use these nodes were given different
        ``max_ttl`` values, which only the nodes' memory bridges."""
        if ms > self.quarantine.ms:
            logger.warning(
                "node %s has seen leases of %d ms, longer than this manager's max_ttl "
                "(%d ms): taking its quarantine. Give every process that uses these nodes "
                "the same MAX_TTL: a node that restarts empty forgets the longer one.",
                node,
                ms,
                self.quarantine.ms,
            )
        self.quarantine.report(node, ms)

    def forget(self, lease: BaseLease) -> None:
        """Drop ``lease`` from the re-entry registry (released, handed off, or let go)."""
        forget_in(self.held, lease)

    # -- adopt -----------------------------------------------------------------------------

    def adoption(
        self, handle: object, auto_extend: object, max_hold: object, origin: object
    ) -> Adoption:
        """Check an adopt's arguments and build its round (sync and asyncio alike).

        Raises:
            TypeError, ValueError: not a handle, one for another key prefix, a ttl that does
                not fit this engine, or a bad argument.
        """
        taken = as_handle(handle)
        if taken.key != self.key_prefix + taken.name:
            raise ValueError(
                f"handle is for another manager's key prefix (this one's is {self.key_prefix!r})"
            )
        try:
            self.validate_ttl(taken.ttl)
        except ValueError as error:
            # The handle's ttl, not one the caller gave: e.g. above this manager's max_ttl.
            message = f"handle: its lease's ttl does not fit this manager: {error}"
            raise ValueError(message) from None
        checked = self.check_arguments(taken.ttl, False, None, auto_extend, max_hold, origin)
        extend, hold, text = checked.auto_extend, checked.hold, checked.origin
        size = len(self.addresses)
        token = secrets.token_hex(20)
        owner = self.owners.record(text)
        return Adoption(
            taken,
            token,
            flow.handoff_round(size, taken.key, taken.token, token, owner, self.quarantine.ms),
            flow.release_round(size, Shape(taken.key), token),
            flow.handback_round(size, taken.key, token, taken.token, self.quarantine.ms),
            owner_scope(),
            extend,
            hold,
            text,
        )

    def adopted(
        self,
        make: Callable[..., _L],
        adoption: Adoption,
        results: Sequence[Any],
        start: float,
        end: float,
        validity: float,
    ) -> _L:
        """The lease a hand-off round sent at ``start`` gave, judged at ``end`` to leave
        ``validity`` seconds (sync and asyncio alike; see ``procedures.lease.adopt``)."""
        taken = adoption.handle
        lease = make(
            name=taken.name,
            key=taken.key,
            token=adoption.token,
            ttl=taken.ttl,
            expires_at=end + validity,
            acquired_at=end,
            origin=adoption.origin,
        )
        lease.fencing_token = taken.fencing_token
        settle_grant(lease, "", held_on(type(reply) is int and reply > 0 for reply in results))
        self.reporter.adopted(lease)
        return self.own(lease, adoption.scope, adoption.auto_extend, adoption.hold, end - start)

    # -- a lease's side of its rounds (procedures.lease.LeaseHost), and its sync rounds ----

    def extend_round(self, lease: BaseLease) -> list[Command]:
        """The commands of a renewal round of ``lease`` (sync and asyncio alike): renew, or
        re-create where a node lost the key (with ``lease``'s owner record)."""
        return renewal_round(lease, len(self.addresses), self.owners.record)

    # The lease's side of its rounds, core.lease's functions themselves (no call between).
    expired_before_renewal = staticmethod(expired_before_renewal)
    lost_error = staticmethod(lost_error)
    renewal_basis = staticmethod(renewal_basis)
    renewal_missed = staticmethod(renewal_missed)
    renewal_lost = staticmethod(renewal_lost)
    renewed = staticmethod(renewed)
    lost_clean_up = staticmethod(lost_clean_up)
    owns_round = staticmethod(owns_round)

    def validity(self, lease: BaseLease) -> float:
        """``lease``'s validity left, in seconds."""
        return lease.validity

    def renew(self, lease: BaseLease) -> float:
        """One sync renewal round of ``lease`` (``procedures.lease.extend``): a sync
        ``Lease.extend``, and the extender thread's renewal of every auto-extended lease,
        sync or asyncio. Returns the new validity in seconds.

        Raises:
            LockLost: the lease ended (its validity ran out, or a quorum no longer holds it);
                its keys are then freed, best effort.
            LeaseNotExtended: no quorum either way; nothing is freed.
        """
        return drive(extend(self, lease), self.connections.get(), self.node_timeout)

    def release(self, lease: BaseLease) -> None:
        """The sync release round of ``lease`` (a sync ``Lease.release``): the round and its
        judgement are ``core.lease``'s (release_round, settle_release), carried out here and
        by ``AsyncLockManager._release``. Not a procedure: one round and no clean-up, on
        every acquire + release pair, where a procedure's calls cost 1.5 % of the pair's
        client instructions (the benchmarks page).

        Raises:
            LockLost: the lease had expired, or a quorum no longer held it.
        """
        connections = self.connections.get()
        commands, yes, expired, identify = release_round(lease, len(self.addresses))
        # Queued behind whatever a node still owes, never skipped: a node that owes many
        # replies (it stalled, or was overloaded while this thread waited) then frees the
        # lock when it catches up instead of keeping the key for the whole ttl.
        exchange = connections.run(
            commands, self.node_timeout, yes, self.quorum, identify=identify, queue_behind=True
        )
        settle_release(lease, exchange.results, exchange.yes, expired)

    def owned(self, lease: BaseLease) -> bool:
        """One sync round trip: does a quorum hold ``lease``'s token (a sync
        ``Lease.owned``)."""
        return drive(owned(self, lease), self.connections.get(), self.node_timeout)
