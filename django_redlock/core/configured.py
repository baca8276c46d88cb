"""What both managers do alike: :class:`EngineConfigured`.

:class:`~django_redlock.core.manager.LockManager` and
:class:`~django_redlock.core.amanager.AsyncLockManager` hold one
:class:`~django_redlock.core.engine.Engine` each (or share one). Everything they do the same
way is written here once: construction and sharing, the read-only settings, the checks of an
acquire's arguments and the procedure it runs (``django_redlock.procedures``), the handles of
semaphores and read-write locks, and the operator calls that do no I/O of a manager's own.
Each manager adds only its driver (``_drive``: the sync or asyncio one) and the methods whose
signature says sync or asyncio.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, Generic, Self, TypeVar, Unpack

from django_redlock.core.engine import (
    DEFAULT_DRIFT_FACTOR,
    DEFAULT_NODE_TIMEOUT,
    DEFAULT_RETRY_DELAY,
    DEFAULT_TIMEOUT,
    DEFAULT_TTL,
    Engine,
    Sharing,
)
from django_redlock.core.handle import LeaseHandle
from django_redlock.core.kinds import RWLock, Semaphore
from django_redlock.core.lease import BaseLease
from django_redlock.core.listing import LockListing, list_locks
from django_redlock.core.owner import owner_scope
from django_redlock.core.reporting import LockObserver
from django_redlock.procedures.acquire import acquire
from django_redlock.procedures.arguments import validate_name, validate_names
from django_redlock.procedures.effects import Effect
from django_redlock.procedures.lease import adopt
from django_redlock.procedures.options import AcquireOptions, ManagerDefault, acquire_options
from django_redlock.procedures.shapes import Many, Shape
from django_redlock.wire.cluster_route import refuse_across_slots
from django_redlock.wire.nodes import NodeAddress

__all__ = ["EngineConfigured"]

_Lease = TypeVar("_Lease", bound=BaseLease)
# What a manager's acquire returns: a Lease, or a coroutine of an AsyncLease.
_Got = TypeVar("_Got")
# How a blocking acquire of the manager sleeps: a function or a coroutine function of seconds.
_Sleep = TypeVar("_Sleep")


class EngineConfigured(Generic[_Lease, _Got, _Sleep]):
    """A manager: its configuration, read from its :attr:`engine` (seconds for times), and
    what the sync and asyncio managers do alike."""

    engine: Engine
    _sleep: _Sleep | None
    # The manager's lease class (Lease, AsyncLease): what it makes and re-enters.
    _lease_class: type[_Lease]

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
        sleep: _Sleep | None = None,
        observer: LockObserver | None = None,
    ) -> None:
        engine = Engine(
            nodes,
            ttl=ttl,
            node_timeout=node_timeout,
            retry_delay=retry_delay,
            default_timeout=default_timeout,
            drift_factor=drift_factor,
            key_prefix=key_prefix,
            max_ttl=max_ttl,
            clock=clock,
            observer=observer,
        )
        self._share(engine, sleep)

    def _share(self, engine: Engine, sleep: _Sleep | None) -> None:
        self.engine = engine
        """The engine this manager holds: configuration, re-entry registry, observer."""
        self._sleep = sleep

    @classmethod
    def sharing(cls, manager: Sharing, *, sleep: _Sleep | None = None) -> Self:
        """A manager of this class on ``manager``'s engine (a sync or asyncio manager): the
        same nodes, configuration, observer and re-entry registry (one set of owners for
        both). ``sleep`` as for the constructor."""
        shared = cls.__new__(cls)
        shared._share(manager.engine, sleep)
        return shared

    def open_connections(self) -> int:
        """How many node sockets the engine's sync transport holds open, across all threads
        (a sync manager's rounds, and the extender's renewals; an asyncio manager's per-loop
        connections are not counted). Counts without I/O."""
        return self.engine.connections.open_count()

    def close(self) -> None:
        """Close the engine's sync node connections (they reopen on demand): a plain
        function, no I/O to await (an asyncio manager's ``aclose`` closes its loop's)."""
        self.engine.close()

    # -- what an acquire runs, for the manager's driver --------------------------------------

    def _acquiring(
        self,
        name: str,
        ttl: float | None,
        blocking: bool,
        timeout: float | ManagerDefault | None,
        auto_extend: bool,
        max_hold: float | None,
        origin: str | None,
    ) -> _Lease | Generator[Effect, Any, _Lease]:
        """``acquire(name, ...)``: the lease this owner already holds on ``name`` (re-entry),
        or the acquire procedure to drive.

        Raises:
            TypeError, ValueError: a bad argument.
        """
        name = validate_name(name)
        # Checked first, so a re-entry refuses bad arguments as a first acquire does.
        engine = self.engine
        checked = engine.check_arguments(ttl, blocking, timeout, auto_extend, max_hold, origin)
        scope = owner_scope()
        if engine.held:  # nothing held in this process: no lookup, one truth test
            held = engine.reenter(scope, name, self._lease_class)
            if held is not None:
                return held
        make = partial(self._lease_class, self)
        shape = Shape(engine.key_prefix + name)
        return acquire(engine, make, name, shape, scope, checked, self._sleep is None)

    def _shaped(
        self, name: str, shape: Shape, options: AcquireOptions
    ) -> Generator[Effect, Any, _Lease]:
        """``acquire_shape(name, shape, **options)``: the acquire procedure, never re-entrant.

        Raises:
            TypeError, ValueError: a bad argument.
        """
        engine = self.engine
        checked = engine.check_arguments(*acquire_options(dict(options)))
        make = partial(self._lease_class, self)
        return acquire(engine, make, name, shape, owner_scope(), checked, self._sleep is None)

    def _many(
        self, names: Iterable[str], options: AcquireOptions, ask: bool
    ) -> tuple[Generator[Effect, Any, _Lease], tuple[str, ...]]:
        """``lock_many(names, **options)``: the acquire procedure of every lock at once, and
        the names, sorted (the lease's ``names``). ``ask``: a node not classified yet (plain
        or cluster) may be asked, blocking (``wire.cluster_route.refuse_across_slots``).

        Raises:
            TypeError, ValueError: a bad name (or a single str), no name, more than 1024;
                names in more than one slot on a cluster node.
        """
        checked = validate_names(names)
        engine = self.engine
        shape = Many([engine.key_prefix + name for name in checked])
        refuse_across_slots(engine.addresses, shape.keys, engine.node_timeout, ask=ask)
        return self._shaped(" + ".join(checked), shape, options), tuple(checked)

    def _adopting(
        self,
        handle: LeaseHandle | str,
        auto_extend: bool,
        max_hold: float | None,
        origin: str | None,
    ) -> Generator[Effect, Any, _Lease]:
        """``adopt(handle, ...)``: the adopt procedure.

        Raises:
            TypeError, ValueError: not a handle, or one for another key prefix.
        """
        engine = self.engine
        adoption = engine.adoption(handle, auto_extend, max_hold, origin)
        return adopt(engine, partial(self._lease_class, self), adoption)

    # -- beyond a lock: semaphores, read-write locks -----------------------------------------

    if TYPE_CHECKING:  # each manager's own, sync or asyncio: what the handles call

        def acquire_shape(
            self, name: str, shape: Shape, **options: Unpack[AcquireOptions]
        ) -> _Got: ...

    def semaphore(self, name: str, limit: int) -> Semaphore[_Got]:
        """The semaphore ``name`` of ``limit`` slots: ``.acquire(...)`` returns a lease of one
        slot (an asyncio manager's is awaited); at most ``limit`` such leases are valid at
        any moment, cluster-wide (see :class:`~django_redlock.core.kinds.Semaphore`). Every
        user of one semaphore must give the same ``limit``.

        Raises:
            TypeError, ValueError: a bad name or limit (1 … 1024).
        """
        return Semaphore(self, validate_name(name), limit)

    def rwlock(self, name: str) -> RWLock[_Got]:
        """The read-write lock ``name``: ``.read(...)`` and ``.write(...)`` return leases (an
        asyncio manager's are awaited; see :class:`~django_redlock.core.kinds.RWLock`).

        Raises:
            TypeError, ValueError: a bad name.
        """
        return RWLock(self, validate_name(name))

    # -- operators -------------------------------------------------------------------------

    def locks(self, prefix: str = "", *, limit: int | None = 1000) -> LockListing:
        """The active locks whose names start with ``prefix``, merged across the nodes: a
        :class:`~django_redlock.core.listing.LockListing` of the first ``limit`` by name
        (None: all of them), with how many it did not show (never the tokens). The cap only
        chooses which locks are shown; each shown lock's node count is read on every node.
        A plain function for both managers: blocking reads through clients of its own, for
        operators, on no hot path.

        Raises:
            TypeError, ValueError: a bad ``prefix`` or ``limit`` (an int of 1 or more, or
                None).
        """
        return list_locks(self, prefix, limit=limit)

    def declare_fresh(self, nodes: Iterable[str] | None = None) -> list[Any]:
        """Let the current server process of every node (or of ``nodes``, given by label or
        URL) vote at once, with no restart quarantine, until it restarts. A plain function
        for both managers: blocking I/O through clients of its own, for operators.

        Only for brand-new nodes, or nodes shut down cleanly with their data: on a node that
        lost locks whose leases still run, it allows a double grant. The declaration names the
        node's run_id, so a later restart (empty, from a snapshot) is quarantined again.

        Returns one :class:`~django_redlock.core.health.Declaration` per node (what was done).

        Raises:
            ValueError: ``nodes`` names a node this manager does not have.
            RedlockError: a node could not be declared (unreachable, refused).
        """
        return self.engine.declare_fresh(nodes)

    def addresses_of(self, nodes: Iterable[str] | None) -> tuple[NodeAddress, ...]:
        """This manager's nodes named in ``nodes`` (labels or URLs; all when None).

        Raises:
            ValueError: a name matches none of them.
        """
        return self.engine.addresses_of(nodes)

    # -- the configuration -----------------------------------------------------------------

    @property
    def addresses(self) -> tuple[NodeAddress, ...]:
        """The nodes, parsed (URL parts, TLS, credentials)."""
        return self.engine.addresses

    @property
    def nodes(self) -> tuple[str, ...]:
        """The nodes' labels (URLs without passwords)."""
        return self.engine.nodes.labels

    @property
    def quorum(self) -> int:
        """How many nodes must agree: ``N // 2 + 1``."""
        return self.engine.quorum

    @property
    def ttl(self) -> float:
        """Default lease length in seconds."""
        return self.engine.ttl

    @property
    def max_ttl(self) -> float:
        """The longest lease an acquire may ask for, in seconds (and the restart quarantine)."""
        return self.engine.max_ttl

    @property
    def node_timeout(self) -> float:
        """Seconds each node has per command."""
        return self.engine.node_timeout

    @property
    def retry_delay(self) -> float:
        """Mean seconds between attempts of a blocking acquire (±50% jitter)."""
        return self.engine.retry_delay

    @property
    def default_timeout(self) -> float | None:
        """Seconds a blocking acquire waits when not told (None: forever)."""
        return self.engine.default_timeout

    @property
    def drift_factor(self) -> float:
        """Share of the ttl set aside for clock drift."""
        return self.engine.drift_factor

    @property
    def key_prefix(self) -> str:
        """Prepended to every lock name to form the Redis key."""
        return self.engine.key_prefix

    @property
    def observer(self) -> LockObserver | None:
        """Told of every acquire, release, renewal, loss and give-up (or None)."""
        return self.engine.observer

    @property
    def quarantine_ms(self) -> int:
        """The restart quarantine sent with every acquire, in milliseconds: ``max_ttl``,
        raised to the longest any node reports (``scripts/node_rule.lua``)."""
        return self.engine.quarantine.ms

    def __repr__(self) -> str:
        engine = self.engine
        return (
            f"<{type(self).__name__} quorum {engine.quorum} of {len(engine.addresses)}: "
            f"{engine.describe()}>"
        )

    def key(self, name: str) -> str:
        """The Redis key of lock ``name``.

        Raises:
            TypeError, ValueError: a bad name.
        """
        return self.engine.key(name)
