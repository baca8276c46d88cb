"""The Redlock algorithm: :class:`LockManager` hands out :class:`Lease` objects.

This module imports no Django (a test proves it), so it can be used from any Python process.

The algorithm follows the Redis "Distributed Locks with Redis" page (the Redlock section):

1. take the current time on a monotonic clock;
2. try to set the key with a random token on all N nodes, each with a timeout far below the
   lease, here all at once (one round trip whatever N, see ``_transport``);
3. the lock is acquired when a quorum ``N // 2 + 1`` granted it and the validity
   ``ttl - elapsed - (ttl * drift_factor + 2 ms)`` is still positive;
4. otherwise unlock every node (the failed ones too: a timed-out SET may still have landed)
   and retry after a random delay.

Redlock alone is an *efficiency* lock: a process pause or a clock jump can let two holders
overlap (Kleppmann, "How to do distributed locking", 2016). Correctness needs the fencing
token checked by the storage; see ``django_redlock.models.FencedModel``.
"""

from __future__ import annotations

import enum
import json
import logging
import math
import random
import secrets
import socket
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from types import TracebackType
from typing import Any, Protocol

from django_redlock.core import extender
from django_redlock.core.arguments import (
    MAX_NAME_BYTES,
    MAX_ORIGIN_BYTES,
    check_seconds,
    clip_origin,
    clip_text,
    validate_name,
)
from django_redlock.exceptions import (
    LeaseInherited,
    LeaseReleased,
    LockContended,
    LockLost,
    LockNotAcquired,
    QuorumUnreachable,
    RedlockError,
)
from django_redlock.wire.nodes import NodeAddress, parse_node, parse_nodes
from django_redlock.wire.process import current_pid
from django_redlock.wire.scripts import (
    FORCE_RELEASE,
    GRANTED,
    HOLDER,
    HOT_SCRIPTS,
    LAPSE,
    LINE,
    NODE_KEY,
    PING,
    Command,
    acquire_command,
    extend_command,
    leave_command,
    owns_command,
    release_command,
)
from django_redlock.wire.sync import (
    TIMED_OUT,
    ConnectionSet,
    Hello,
    NodeError,
    NotSent,
    ThreadConnections,
)

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
    "Lease",
    "LockManager",
]

logger = logging.getLogger("django_redlock")

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


class _ManagerDefault(enum.Enum):
    """The type of :data:`MANAGER_DEFAULT`."""

    TIMEOUT = "the manager's default_timeout"


MANAGER_DEFAULT = _ManagerDefault.TIMEOUT
"""``acquire(timeout=...)``'s default: the manager's ``default_timeout``."""
MAX_TTL = 86400.0
"""Longest lease accepted, in seconds (one day): longer is almost surely a unit mistake."""
MAX_OWNER_BYTES = 4096
"""Longest owner record stored with a lock (its JSON, in bytes): host, pid, thread and task
names, origin and time. Text fields are cut further when escapes make it longer."""

# Seconds between two "acquired despite node errors" warnings of one manager.
_WARN_EVERY = 10.0
# The spec adds 2 ms to the drift term for the resolution of the nodes' expiry clocks.
_DRIFT_MILLIS = 0.002
# Byte budgets of the owner record's names (thread, task, host) before JSON escaping.
_MAX_OWNER_NAME_BYTES = 256


class BaseLease:
    """What :class:`Lease` and :class:`~django_redlock.aredlock.AsyncLease` share: the state
    of a held lock and the checks that need no I/O. Not made directly; the two subclasses add
    ``extend``/``release`` (plain or coroutines) and ``with`` or ``async with``.

    The lease object is the owner: its token lives here, not in a thread-local, so threads
    and asyncio tasks can never share or overwrite each other's tokens.

    Attributes:
        name: the lock name.
        key: the Redis key on every node.
        ttl: the lease length in seconds.
        fencing_token: the database-minted fencing token, or ``None`` when not fenced.
    """

    def __init__(
        self,
        manager: LockManager,
        *,
        name: str,
        key: str,
        token: str,
        ttl: float,
        expires_at: float,
        acquired_at: float,
        origin: str | None = None,
    ) -> None:
        self._manager = manager
        self.name = name
        self.key = key
        self._token = token
        self.ttl = ttl
        self.origin = clip_origin(origin)
        self.acquired_at = acquired_at
        self._expires_at = expires_at
        self.fencing_token: int | None = None
        self._released = False
        self._lost_reason: str | None = None
        # Set for auto-extended leases only: serialises the extender's renewals with the
        # owner's release, so a renewal never races a release into a false "lost".
        self._guard: threading.Lock | None = None
        self._renew_until: float | None = None
        self._depth = 1
        self._scope: tuple[object, ...] | None = None
        self._waiter = ""  # the waiter id of a blocking acquire, dropped from the line at release
        # The process that took the lease owns it; a forked child has a copy of this object
        # but not the lease (see _refuse_inherited).
        self._pid = current_pid()

    @property
    def token(self) -> str:
        """The random lease token. A bearer secret: never logged, never shown."""
        return self._token

    def __repr__(self) -> str:
        state = "released" if self._released else "lost" if self.lost else "held"
        if self.inherited:
            state += f" by process {self._pid} (inherited)"
        return f"<{type(self).__name__} {self.name!r} {state}, validity={self.validity:.3f}s>"

    @property
    def validity(self) -> float:
        """Seconds the lease is still known valid by the local monotonic clock (≥ 0)."""
        return max(0.0, self._expires_at - self._manager._clock())

    def remaining(self) -> float:
        """Seconds of validity left by the local monotonic clock (≥ 0): :attr:`validity`, as
        a method. Asks no node; see ``owned()`` for that."""
        return self.validity

    @property
    def lost(self) -> bool:
        """True once the lease may no longer be held (expired, or an extend/release found it
        gone). A released lease is not lost."""
        if self._released:
            return False
        return self._lost_reason is not None or self._expires_at <= self._manager._clock()

    @property
    def released(self) -> bool:
        """True once :meth:`release` was called on this lease."""
        return self._released

    @property
    def inherited(self) -> bool:
        """True in a process forked from the lease's owner: there the lease cannot be
        released, extended or checked (:class:`LeaseInherited`)."""
        return self._pid != current_pid()

    def _left_inherited(self) -> bool:
        """True (with a warning) when a ``with`` block of this lease ends in a forked child,
        which must leave the parent's keys alone (sync and asyncio alike)."""
        if self._pid == current_pid():
            return False
        logger.warning(
            "process %d left the with block of lease %r inherited through fork(): the "
            "lease stays with process %d, nothing was released",
            current_pid(),
            self.name,
            self._pid,
        )
        return True

    def _refuse_inherited(self) -> None:
        """Raise :class:`LeaseInherited` in a forked child.

        Checked before anything else, the guard included: the parent's extender thread may
        have held the guard at the instant of the fork, and the child's copy of it then stays
        locked forever.
        """
        if self._pid != current_pid():
            raise LeaseInherited(self.name, self._pid, current_pid())

    @property
    def auto_extended(self) -> bool:
        """True while a background thread renews this lease (see ``auto_extend``)."""
        return self._guard is not None and not self._released and self._lost_reason is None

    def _mark_lost(self, reason: str) -> None:
        if self._lost_reason is None:
            self._lost_reason = reason
            self._manager._notify_lost(self, reason)

    def _renew_once(self) -> float | None:
        """One renewal by the extender; returns when the next is due, or None to stop."""
        assert self._guard is not None
        with self._guard:
            if self._released or self._lost_reason is not None:
                return None
            now = time.monotonic()
            if self._renew_until is not None and now >= self._renew_until:
                logger.info("max_hold reached for %r: renewal stops, the lease runs out", self.name)
                return None
            try:
                self._manager._extend(self)
            except (LockLost, LeaseReleased) as error:
                logger.warning("auto-extension of %r failed: %s", self.name, error)
                return None
        return time.monotonic() + self.ttl / 3

    def check(self) -> None:
        """Raise unless the lease is still valid.

        Raises:
            LeaseReleased: the lease was released.
            LockLost: the lease expired or was found lost.
            LeaseInherited: called in a forked child (it cannot know its parent's lease).
        """
        self._refuse_inherited()
        if self._released:
            raise LeaseReleased(self.name)
        if self._lost_reason is not None:
            raise LockLost(self.name, self._lost_reason)
        if self._expires_at <= self._manager._clock():
            self._mark_lost("the lease expired")
            raise LockLost(self.name, "the lease expired")

    @property
    def depth(self) -> int:
        """How many times the owner holds it (re-entries in the same thread or task)."""
        return 0 if self._released else self._depth


class Lease(BaseLease):
    """A held lock: returned by :meth:`LockManager.acquire`, released by :meth:`release`,
    or by leaving its ``with`` block (see :class:`BaseLease` for the attributes)."""

    def extend(self) -> float:
        """Renew the lease to its full ttl on a quorum; returns the new validity in seconds.

        Only keys that still hold this lease's token are renewed; an expired key is never
        re-created (lease continuity), so an extend can not resurrect a lock someone else may
        have taken in between.

        Raises:
            LeaseReleased: the lease was released.
            LockLost: the lease had expired, or fewer than a quorum still held it, or the
                renewal finished after the old validity ran out. The lease is then released
                everywhere (best effort) and stays lost.
            LeaseInherited: called in a forked child; nothing is sent to the nodes.
        """
        self._refuse_inherited()
        guard = self._guard
        if guard is None:
            self.check()
            return self._manager._extend(self)
        with guard:
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
            self._release_now()
            return
        with guard:
            self._release_now()

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

    def _release_now(self) -> None:
        if self._released:
            raise LeaseReleased(self.name)
        if self._depth > 1:
            self._depth -= 1  # an inner re-entry ends; the keys stay until the last exit
            return
        self._released = True
        self._manager._forget_owner(self)
        self._manager._release(self)

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
        if self._left_inherited():
            return
        if self._released:
            return
        if exc is None:
            lost = self._lost_reason
            self.release()  # raises LockLost itself when the nodes say it was lost
            if lost is not None:
                # Lost earlier (a failed renewal): the block may have overlapped another
                # holder, even if our keys happened to be found at release.
                raise LockLost(self.name, lost)
            return
        try:
            self.release()
        except (LockLost, LeaseReleased) as release_error:
            # Never hide the block's own exception behind the release's.
            logger.warning("releasing %r after an error: %s", self.name, release_error)


class LockObserver(Protocol):
    """Hears about every lease of a manager (the Django layer sends signals and keeps metrics
    through one). Called synchronously in the thread that did the operation; the extender
    thread reports lost renewals. Must not raise; must be quick."""

    def acquired(self, lease: BaseLease, waited: float) -> None:
        """A lease was taken after ``waited`` seconds."""

    def released(self, lease: BaseLease, held: float) -> None:
        """A lease was released after ``held`` seconds (also when release raised LockLost)."""

    def extended(self, lease: BaseLease, validity: float) -> None:
        """A lease was renewed (by its owner or the extender); ``validity`` seconds left."""

    def lost(self, lease: BaseLease, reason: str) -> None:
        """A lease was found lost (expired, renewal failed, or gone at release); once each."""

    def gave_up(self, error: LockNotAcquired, waited: float) -> None:
        """An acquire raised ``error`` after ``waited`` seconds."""


class _Quarantine:
    """The restart quarantine a manager sends with every acquire, in milliseconds: its own
    ``max_ttl``, raised to the longest any node reports (``scripts/node_rule.lua``).

    Shared with the manager's connections, which report each node's value as they connect
    (:class:`~django_redlock.wire.sync.Hello`), without holding the manager itself.
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


class _LockContext:
    """What :meth:`LockManager.lock` returns: acquires on enter, releases on exit."""

    def __init__(self, manager: LockManager, name: str, options: dict[str, Any]) -> None:
        self._manager = manager
        self._name = name
        self._options = options
        self._lease: Lease | None = None

    def __enter__(self) -> Lease:
        self._lease = self._manager.acquire(self._name, **self._options)
        return self._lease

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        assert self._lease is not None
        self._lease.__exit__(exc_type, exc, traceback)


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
        sleep: how to wait between attempts (tests inject a fake one).
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
        sleep: Callable[[float], None] = time.sleep,
        observer: LockObserver | None = None,
    ) -> None:
        self.addresses: tuple[NodeAddress, ...] = parse_nodes(nodes)
        self.observer = observer
        self.node_timeout = check_seconds(node_timeout, "node_timeout")
        self.retry_delay = check_seconds(retry_delay, "retry_delay")
        self.default_timeout = (
            None
            if default_timeout is None
            else check_seconds(default_timeout, "default_timeout", allow_zero=True)
        )
        drift = check_seconds(drift_factor, "drift_factor", allow_zero=True)
        if drift >= 0.5:
            raise ValueError(f"drift_factor must be below 0.5, not {drift_factor!r}")
        self.drift_factor = drift
        if not isinstance(key_prefix, str):
            raise TypeError(f"key_prefix must be a str, not {type(key_prefix).__name__}")
        self.key_prefix = key_prefix
        self._clock = clock
        self._sleep = sleep
        self.max_ttl = MAX_TTL
        self.ttl = self._validate_ttl(ttl)
        self.max_ttl = self._validate_ttl(
            max(self.ttl, 60.0) if max_ttl is None else max_ttl, "max_ttl"
        )
        if self.ttl > self.max_ttl:
            raise ValueError(f"ttl={ttl!r} is above max_ttl={max_ttl!r}")
        self._quarantine = _Quarantine(math.ceil(self.max_ttl * 1000))
        # What every new connection (sync or asyncio) asks its node first (see Hello).
        self._hello = Hello(NODE_KEY, self._quarantine.report)
        self.quorum = len(self.addresses) // 2 + 1
        self._host = socket.gethostname()
        self._owner_cache: dict[tuple[object, ...], str] = {}
        # Leases by (owner scope, name), for re-entry. The scope names the process, thread
        # and asyncio task, so another thread, task or a forked child is never the owner.
        # Weak values: a lease dropped without release must not be kept alive (and renewed
        # by the extender, which holds leases weakly too) by this registry; it then runs out
        # within its ttl.
        self._held: weakref.WeakValueDictionary[tuple[tuple[object, ...], str], BaseLease] = (
            weakref.WeakValueDictionary()
        )
        self._last_warning = float("-inf")
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
                max_outstanding=32,
                # A node that owes replies this long gets a fresh connection (bounded count:
                # the old one is closed), so a half-open socket cannot block it forever.
                stall_reset=max(1.0, 20 * self.node_timeout),
                preload=HOT_SCRIPTS,
                hello=self._hello,
            )
        )

    def __repr__(self) -> str:
        nodes = ", ".join(address.label for address in self.addresses)
        return f"<LockManager quorum {self.quorum} of {len(self.addresses)}: {nodes}>"

    @property
    def nodes(self) -> tuple[str, ...]:
        """The nodes' labels (URLs without passwords)."""
        return tuple(address.label for address in self.addresses)

    def open_connections(self) -> int:
        """How many node sockets this manager holds open, across all threads."""
        return self._connections.open_count()

    def close(self) -> None:
        """Close every node connection this manager opened (they reopen on demand)."""
        self._connections.close()

    def __enter__(self) -> LockManager:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def _validate_ttl(self, ttl: object, argument: str = "ttl") -> float:
        seconds = check_seconds(ttl, argument)
        if seconds > MAX_TTL:
            raise ValueError(f"{argument}={ttl!r} is above the cap of {MAX_TTL:g} seconds")
        if seconds > self.max_ttl:
            raise ValueError(
                f"{argument}={ttl!r} is above max_ttl={self.max_ttl:g}: raise max_ttl (the "
                "restart quarantine) to take longer leases"
            )
        # One attempt costs up to one node timeout; the lease must outlive that plus drift,
        # or validity could never be positive.
        floor = self.node_timeout + seconds * self.drift_factor + _DRIFT_MILLIS
        if seconds <= floor:
            raise ValueError(
                f"{argument}={ttl!r} is too short: with node_timeout={self.node_timeout:g} the "
                f"lease must be longer than {floor:.3f} seconds"
            )
        return seconds

    def key(self, name: str) -> str:
        """The Redis key of lock ``name``."""
        return self.key_prefix + validate_name(name)

    def _owner(self, origin: str | None) -> str:
        """Owner metadata as JSON: host, pid, thread, origin, acquired_at (epoch seconds).

        Built from a per-thread cached prefix: json.dumps on every acquire would cost more
        than a loopback round trip on a small VM.
        """
        thread = threading.current_thread()
        task = _current_task_name()
        cache = self._owner_cache
        origin = clip_origin(origin)  # also bounds the cache's keys
        key = (current_pid(), thread.ident, thread.name, task, origin)
        prefix = cache.get(key)
        if prefix is None:
            prefix = _owner_prefix(self._host, key[0], thread.name, task, origin)
            if len(cache) > 1024:
                cache.clear()
            cache[key] = prefix
        return f"{prefix}{time.time():.6f}}}"

    # -- acquire ---------------------------------------------------------------------------

    def acquire(
        self,
        name: str,
        *,
        ttl: float | None = None,
        blocking: bool = True,
        timeout: float | _ManagerDefault | None = MANAGER_DEFAULT,
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
        seconds, wait, hold = self._acquire_arguments(
            ttl, blocking, timeout, auto_extend, max_hold, origin
        )
        scope = _owner_scope()
        held = self._held.get((scope, name))
        if isinstance(held, Lease) and not held.released and not held.lost:
            # Re-entry by the same owner (thread or asyncio task): the same lease, counted.
            held._depth += 1
            return held
        origin = clip_origin(origin)
        key = self.key_prefix + name
        ttl_ms = math.ceil(seconds * 1000)
        owner = self._owner(origin)
        started = self._clock()
        deadline = None if (blocking and wait is None) else started + (wait or 0.0)
        # A blocking acquire waits in a line with one ticket on every node (fair hand-off);
        # a single try never queues.
        connections = self._connections.get()
        if len(self._quarantine.heard) < self.quorum:
            self._first_contact(connections)
        waiter = connections.subscriber.waiter_id() if blocking else ""
        ticket = time.time_ns() // 1000
        lifetime_ms = math.ceil(max(1.0, 4 * self.retry_delay) * 1000)
        listening = False
        polls = 0  # waits in a row that ended without a wake-up
        attempts = 0
        while True:
            attempts += 1
            # A fresh token per attempt: the clean-up release of a failed attempt may
            # reach a node late (pipelined, or re-sent after NOSCRIPT) and must never hit a
            # later attempt's key.
            token = secrets.token_hex(20)
            command = acquire_command(
                key, token, ttl_ms, owner, self._quarantine.ms, waiter, ticket, lifetime_ms
            )
            lease, error = self._attempt(name, key, token, seconds, command, attempts, origin)
            if lease is not None:
                self._adopt(lease, scope, waiter, auto_extend, hold, started)
                return lease
            assert error is not None
            now = self._clock()
            if not blocking or (deadline is not None and now >= deadline):
                if waiter:
                    self._leave_line(connections, key, waiter)
                raise self._give_up(error, origin, now - started)
            delay = self._retry_delay(now, deadline, polls)
            if self._sleep is not time.sleep:
                self._sleep(delay)  # an injected sleep (tests) replaces the notifications
            elif not listening and connections.subscriber.subscribe(key, self.node_timeout):
                # Just subscribed: a release from now on wakes us, and the try right after
                # subscribing covers a release that came between our try and the subscription.
                listening = True
            else:
                # Listening since before our last try (this thread kept the channel from an
                # earlier wait): any release since then was published to us.
                listening = True
                if not connections.subscriber.wait(delay, waiter):
                    polls += 1

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
        connections.run([PING] * size, time.monotonic() + self.node_timeout, b"PONG", self.quorum)

    def _adopt(
        self,
        lease: BaseLease,
        scope: tuple[object, ...],
        waiter: str,
        auto_extend: bool,
        hold: float | None,
        started: float,
    ) -> None:
        """Make a lease just granted its owner's (sync and asyncio alike): registered for
        re-entry, renewed if asked, reported to the observer."""
        # Our place in line may remain on nodes that did not grant this attempt; the release
        # drops it there (see release.lua), at no extra round trip.
        lease._waiter = waiter
        if auto_extend:
            lease._guard = threading.Lock()
            if hold is not None:
                lease._renew_until = time.monotonic() + hold
            extender.schedule(lease, time.monotonic() + lease.ttl / 3)
        lease._scope = scope
        self._held[(scope, lease.name)] = lease
        if self.observer is not None:
            self.observer.acquired(lease, lease.acquired_at - started)

    def _retry_delay(self, now: float, deadline: float | None, polls: int = 0) -> float:
        """Seconds until the next try: ``retry_delay`` ± 50 % jitter, never past ``deadline``.

        ``polls``: how many waits in a row ended with no wake-up. A waiter is woken by the
        release that makes it the head of the line (pub/sub); its poll only covers a wake-up
        lost to a node failure, so the poll backs off, doubling each time up to a fifth of
        the life of a place in line (``max(1 s, 4 * retry_delay)``; never below
        ``retry_delay``): even with the jitter and a slow try, the place is kept.
        Without it, hundreds of waiters polling at a short ``retry_delay`` saturate the
        nodes, and every release and hand-off waits behind their retries (benchmark W5).
        """
        base = self.retry_delay
        if polls:
            cap = max(base, max(1.0, 4 * base) / 5)
            base = min(base * 2.0 ** min(polls, 20), cap)
        delay = base * random.uniform(0.5, 1.5)
        return delay if deadline is None else min(delay, deadline - now)

    def _validity(self, ttl: float, elapsed: float) -> float:
        """Seconds a lease of ``ttl`` seconds is good for after a round of ``elapsed`` seconds:
        the Redlock validity, ``ttl - elapsed - (ttl * drift_factor + 2 ms)``."""
        return ttl - elapsed - (ttl * self.drift_factor + _DRIFT_MILLIS)

    def _leave_line(self, connections: ConnectionSet, key: str, waiter: str) -> None:
        """Fire-and-forget: drop out of the wait line so the next waiter need not wait for
        our place to lapse (behind our last try on each connection, see ``clean_up``)."""
        connections.clean_up([leave_command(key, waiter)] * len(self.addresses))

    def _acquire_arguments(
        self,
        ttl: object,
        blocking: object,
        timeout: object,
        auto_extend: object,
        max_hold: object,
        origin: object,
    ) -> tuple[float, float | None, float | None]:
        """Check ``acquire``'s arguments (sync and asyncio alike); returns the lease length,
        the wait (None: forever) and the hold limit, all in seconds.

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
        return seconds, wait, hold

    # -- what both managers report: the asyncio manager calls these too, so one acquire,
    # extend or give-up logs and notifies the same whichever manager made it.

    def _log_granted(self, name: str, results: Sequence[Any], granted: int) -> None:
        """Log an attempt that won lock ``name`` with ``granted`` votes (sync and asyncio)."""
        logger.info("acquired %r on %d/%d nodes", name, granted, len(self.addresses))
        if (
            any(reply is TIMED_OUT or isinstance(reply, NodeError) for reply in results)
            and self._warn_now()
        ):
            logger.warning(
                "acquired %r despite node errors (at most one such warning per %g s): %s",
                name,
                _WARN_EVERY,
                _summarise(self.addresses, results, self.node_timeout),
            )

    def _give_up(
        self, error: LockNotAcquired, origin: str | None, waited: float
    ) -> LockNotAcquired:
        """Report an acquire that gives up after ``waited`` seconds (sync and asyncio alike):
        logged and told to the observer. Returns ``error``, for the caller to raise."""
        logger.debug("gave up on %r: %s", error.name, error)
        error.origin = origin
        if self.observer is not None:
            self.observer.gave_up(error, waited)
        return error

    def _judge_extend(
        self, lease: BaseLease, start: float, now: float, results: list[Any], yes: int, no: int
    ) -> float:
        """Report an extend round of ``lease`` that ran from ``start`` to ``now`` (sync and
        asyncio alike): ``yes`` nodes renewed it, ``no`` did not. Returns the new validity in
        seconds.

        Raises:
            LockLost: not renewed on a quorum in time; the lease is now marked lost (the
                caller frees what keys may be left).
        """
        validity = self._validity(lease.ttl, now - start)
        if yes >= self.quorum and now < lease._expires_at and validity > 0:
            lease._expires_at = now + validity
            logger.debug("extended %r on %d/%d nodes", lease.name, yes, len(self.addresses))
            if self.observer is not None:
                self.observer.extended(lease, validity)
            return validity
        reason = self._not_extended(lease, now, no, results)
        lease._mark_lost(reason)
        raise LockLost(lease.name, reason)

    def _failure(
        self, name: str, results: Sequence[Any], granted: int, elapsed: float, attempts: int
    ) -> LockNotAcquired:
        """The error of failed attempt number ``attempts`` (sync and asyncio alike), logged at
        debug level: contended when the nodes that answered could still have formed a quorum,
        else quorum unreachable."""
        size = len(self.addresses)
        held = [reply for reply in results if type(reply) is int]
        # When the holder's keys have run out on enough nodes for a quorum (if it does not
        # renew): besides the nodes that granted this attempt, `need` more must free up, so
        # the need-th shortest time left among the holders' answers. Keys without expiry
        # (-1) never run out; nodes not heard from are not counted (a lower bound then).
        expiring = sorted(reply for reply in held if reply >= 0)
        need = self.quorum - granted
        retry_after = expiring[need - 1] / 1000 if 0 < need <= len(expiring) else None
        errors = {
            self.addresses[index].label: _error_text(reply, self.node_timeout)
            for index, reply in enumerate(results)
            if reply is TIMED_OUT or isinstance(reply, NodeError)
        }
        refusing = [node for node, text in errors.items() if text.startswith("QUARANTINED")]
        if refusing and self._warn_now():
            # The operator's cue (same text as the error, the status command and the admin):
            # at most one such warning per _WARN_EVERY, as a refusing node repeats it.
            for node in refusing:
                logger.warning("node %s does not vote: %s", node, errors[node])
        kind: type[LockNotAcquired] = QuorumUnreachable
        if granted >= self.quorum:
            errors["validity"] = f"attempt took {elapsed * 1000:.1f} ms, nothing left of the lease"
        elif len(errors) <= size - self.quorum:
            kind = LockContended
        error = kind(
            name,
            votes=granted,
            quorum=self.quorum,
            node_errors=errors,
            retry_after=retry_after,
            attempts=attempts,
        )
        logger.debug("attempt %d on %r failed: %s", attempts, name, error)
        return error

    def locks(self, prefix: str = "", *, limit: int = 1000) -> Any:
        """The active locks whose names start with ``prefix``, merged across the nodes: a
        :class:`~django_redlock.core.operators.LockListing` (SCAN, capped at ``limit`` keys per
        node; never the tokens)."""
        from django_redlock.core.operators import list_locks

        return list_locks(self, prefix, limit=limit)

    def force_release(self, name: str) -> int:
        """Delete lock ``name`` on every node, whoever holds it; returns how many nodes had
        it. For operators: the evicted holder is not told, so pair it with a fencing token
        bump (the admin page does) wherever writes must be refused.

        Raises:
            TypeError, ValueError: a bad name.
        """
        key = self.key_prefix + validate_name(name)
        command = FORCE_RELEASE.command((key, key + LINE, key + LAPSE), ())
        size = len(self.addresses)
        exchange = self._connections.get().run(
            [command] * size, time.monotonic() + self.node_timeout, 1, size, give_up=size
        )
        deleted: int = exchange.yes
        logger.warning("force-released %r on %d/%d nodes", name, deleted, size)
        return deleted

    def declare_fresh(self, nodes: Iterable[str] | None = None) -> list[Any]:
        """Let the current server process of every node (or of ``nodes``, given by label or
        URL) vote at once, with no restart quarantine, until it restarts.

        Only for brand-new nodes, or nodes shut down cleanly with their data: on a node that
        lost locks whose leases still run, it allows a double grant. The declaration names the
        node's run_id, so a later restart (empty, from a snapshot) is quarantined again.

        Returns one :class:`~django_redlock.core.operators.Declaration` per node (what was done).

        Raises:
            ValueError: ``nodes`` names a node this manager does not have.
            RedlockError: a node could not be declared (unreachable, refused).
        """
        from django_redlock.core.operators import declare_fresh

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

    def locked(self, name: str) -> bool:
        """Whether lock ``name`` is held on a quorum of the nodes now (one round trip, by
        anyone; see :meth:`holder` for who).

        Raises:
            TypeError, ValueError: a bad name.
        """
        owner = self.holder(name)
        return owner is not None and owner["nodes"] >= self.quorum

    def _owned(self, lease: BaseLease) -> bool:
        """One round trip: does a quorum hold ``lease``'s token (sync ``Lease.owned``)."""
        size = len(self.addresses)
        exchange = self._connections.get().run(
            [owns_command(lease.key, lease.token)] * size,
            time.monotonic() + self.node_timeout,
            1,
            self.quorum,
        )
        return exchange.yes >= self.quorum and lease.validity > 0

    def holder(self, name: str) -> dict[str, Any] | None:
        """Who holds lock ``name``, from the owner metadata stored with it, or None.

        Returns the owner dict (host, pid, thread, task, origin, acquired_at as epoch
        seconds) as found on most nodes that answered, plus ``nodes`` (how many hold it) and
        ``ttl`` (the longest remaining seconds among them). Never the token.

        Raises:
            TypeError, ValueError: a bad name.
        """
        key = self.key_prefix + validate_name(name)
        command = HOLDER.command((key,), ())
        size = len(self.addresses)
        exchange = self._connections.get().run(  # every node's answer is wanted
            [command] * size, time.monotonic() + self.node_timeout, None, size, give_up=size
        )
        owners: dict[str, int] = {}
        ttls: dict[str, float] = {}
        for reply in exchange.results:
            if isinstance(reply, list) and len(reply) == 2 and isinstance(reply[0], bytes):
                raw = reply[0].decode("utf-8", "replace")
                owners[raw] = owners.get(raw, 0) + 1
                ttls[raw] = max(ttls.get(raw, 0.0), reply[1] / 1000)
        if not owners:
            return None
        raw, count = max(owners.items(), key=lambda item: item[1])
        try:
            owner = json.loads(raw)
        except ValueError:
            owner = {"raw": raw}
        if not isinstance(owner, dict):
            owner = {"raw": raw}
        owner["nodes"] = count
        owner["ttl"] = ttls[raw]
        return owner

    def _warn_now(self) -> bool:
        """Rate limit for warnings that a loaded or degraded cluster would repeat on every
        acquire (a stalled node): logging them all would cost more than the locks."""
        now = time.monotonic()
        if now - self._last_warning < _WARN_EVERY:
            return False
        self._last_warning = now
        return True

    def _forget_owner(self, lease: BaseLease) -> None:
        if lease._scope is not None and self._held.get((lease._scope, lease.name)) is lease:
            del self._held[(lease._scope, lease.name)]

    def _notify_lost(self, lease: BaseLease, reason: str) -> None:
        logger.warning("lease on %r lost: %s", lease.name, reason)
        if self.observer is not None:
            self.observer.lost(lease, reason)

    def _attempt(
        self,
        name: str,
        key: str,
        token: str,
        ttl: float,
        command: Command,
        attempts: int,
        origin: str | None,
    ) -> tuple[Lease | None, LockNotAcquired | None]:
        connections = self._connections.get()
        size = len(self.addresses)
        quorum = self.quorum
        start = self._clock()
        try:
            exchange = connections.run(
                [command] * size,
                time.monotonic() + self.node_timeout,
                GRANTED,
                quorum,
                identify=True,
            )
            elapsed = self._clock() - start
        except BaseException:
            # Interrupted (KeyboardInterrupt, a signal handler raising): some SETs may have
            # landed, and nobody will release them.
            self._forget(connections, key, token, None)
            raise
        validity = self._validity(ttl, elapsed)
        granted = exchange.yes
        results = exchange.results
        if granted >= quorum and validity > 0:
            self._log_granted(name, results, granted)
            # The keys were set no earlier than `start`, so they live (on the nodes' clocks,
            # less drift) until start + ttl - drift: that instant is when validity reaches 0.
            expires_at = start + elapsed + validity
            lease = Lease(
                self,
                name=name,
                key=key,
                token=token,
                ttl=ttl,
                expires_at=expires_at,
                acquired_at=start + elapsed,
                origin=origin,
            )
            return lease, None

        # Failed: unlock everywhere our SET may have landed, the failed nodes included.
        self._forget(connections, key, token, results)
        return None, self._failure(name, results, granted, elapsed, attempts)

    def _forget(
        self, connections: ConnectionSet, key: str, token: str, results: list[Any] | None
    ) -> None:
        """Fire-and-forget release after a failed attempt (replies are drained later).

        Pipelined on the same per-node connection as the SET, even to a node that owes many
        replies (``ConnectionSet.clean_up``), so a stalled node applies the release after the
        SET when it wakes up and no zombie key is left behind.
        """
        command = release_command(key, token)
        # A node that answered with another holder's time left holds no key of ours, and one
        # the SET never reached (NotSent) has nothing to undo: clean-ups to nodes that owe
        # many replies are bounded, so none is spent there.
        commands: list[Command | None] = [
            None
            if results is not None
            and (type(results[index]) is int or type(results[index]) is NotSent)
            else command
            for index in range(len(self.addresses))
        ]
        connections.clean_up(commands)

    # -- release and extend ----------------------------------------------------------------

    def _release(self, lease: Lease) -> None:
        connections = self._connections.get()
        size = len(self.addresses)
        quorum = self.quorum
        expired = lease._expires_at <= self._clock()
        command = release_command(lease.key, lease.token, lease._waiter)
        # Queued behind whatever a node still owes, never skipped: a node that owes many
        # replies (it stalled, or was overloaded while this thread waited) then frees the
        # lock when it catches up instead of keeping the key for the whole ttl.
        exchange = connections.run(
            [command] * size, time.monotonic() + self.node_timeout, 1, quorum, queue_behind=True
        )
        self._judge_release(lease, exchange.results, exchange.yes, expired)

    def _not_extended(self, lease: BaseLease, now: float, refused: int, results: list[Any]) -> str:
        """Why an extend round failed (sync and asyncio alike), for ``LockLost``."""
        if now >= lease._expires_at:
            return "the lease expired while it was being extended"
        return (
            f"not extended on {refused} of {len(self.addresses)} nodes, a quorum needs "
            f"{self.quorum} "
            f"({_summarise(self.addresses, results, self.node_timeout, of_lease=True)})"
        )

    def _judge_release(
        self, lease: BaseLease, results: list[Any], deleted: int, expired: bool
    ) -> None:
        """Report a release round (sync and asyncio alike): ``results`` per node, ``deleted``
        the nodes that held the key, ``expired`` whether the lease had run out before it.

        Raises:
            LockLost: the lease had expired, or too many nodes no longer held it.
        """
        size = len(self.addresses)
        quorum = self.quorum
        gone = sum(1 for reply in results if reply == 0)
        if self.observer is not None:
            self.observer.released(lease, self._clock() - lease.acquired_at)
        if expired:
            lease._mark_lost("the lease expired before it was released")
            raise LockLost(lease.name, "the lease expired before it was released")
        if gone > size - quorum:
            reason = (
                f"only {deleted} of {size} nodes still held it at release "
                f"({_summarise(self.addresses, results, self.node_timeout, of_lease=True)})"
            )
            lease._mark_lost(reason)
            raise LockLost(lease.name, reason)
        if deleted < quorum:
            logger.warning(
                "released %r on %d/%d nodes; the rest did not answer (%s) and expire by ttl",
                lease.name,
                deleted,
                size,
                _summarise(self.addresses, results, self.node_timeout, of_lease=True),
            )
        else:
            logger.info("released %r", lease.name)

    def _extend(self, lease: BaseLease) -> float:
        connections = self._connections.get()
        size = len(self.addresses)
        quorum = self.quorum
        ttl_ms = math.ceil(lease.ttl * 1000)
        command = extend_command(lease.key, lease.token, ttl_ms)
        start = self._clock()
        exchange = connections.run(
            [command] * size, time.monotonic() + self.node_timeout, 1, quorum
        )
        now = self._clock()
        try:
            return self._judge_extend(
                lease, start, now, exchange.results, exchange.yes, exchange.no
            )
        except LockLost:
            # Best effort: free the keys we may still hold so the next holder need not wait.
            self._forget(connections, lease.key, lease.token, None)
            raise

    def lock(
        self,
        name: str,
        *,
        ttl: float | None = None,
        blocking: bool = True,
        timeout: float | _ManagerDefault | None = MANAGER_DEFAULT,
        auto_extend: bool = False,
        max_hold: float | None = None,
        origin: str | None = None,
    ) -> _LockContext:
        """A context manager: acquire on enter (yielding the :class:`Lease`), release on exit.

        Takes the same arguments as :meth:`acquire` and raises what it raises; leaving the
        block raises :class:`LockLost` if the lease was lost, unless the block itself raised.
        """
        return _LockContext(
            self,
            name,
            {
                "ttl": ttl,
                "blocking": blocking,
                "timeout": timeout,
                "auto_extend": auto_extend,
                "max_hold": max_hold,
                "origin": origin,
            },
        )


def _owner_prefix(host: str, pid: int, thread: str, task: str | None, origin: str | None) -> str:
    """The owner record's JSON up to its ``acquired_at`` value, at most
    :data:`MAX_OWNER_BYTES` long once the time is appended.

    The text fields are cut to their budgets; JSON escapes (``\\uXXXX`` for non-ASCII and
    control characters) can still make the record longer, so the budgets are halved until it
    fits. ASCII throughout (``ensure_ascii``): the hot-path encoder of the acquire needs it.
    """
    names, origin_budget = _MAX_OWNER_NAME_BYTES, MAX_ORIGIN_BYTES
    while True:
        body = json.dumps(
            {
                "host": clip_text(host, names),
                "pid": pid,
                "thread": clip_text(thread, names),
                "task": None if task is None else clip_text(task, names),
                "origin": None if origin is None else clip_text(origin, origin_budget),
            },
            separators=(",", ":"),
        )
        prefix = body[:-1] + ',"acquired_at":'
        # The time appended is at most 18 characters (10 digits, a point, 6 digits, "}").
        if len(prefix) + 18 <= MAX_OWNER_BYTES or (names <= 8 and origin_budget <= 8):
            return prefix
        names, origin_budget = max(8, names // 2), max(8, origin_budget // 2)


def _owner_scope() -> tuple[object, ...]:
    """Who owns a lease taken here: (pid, thread id, asyncio task or None)."""
    asyncio = sys.modules.get("asyncio")
    task = None
    if asyncio is not None and asyncio.events._get_running_loop() is not None:
        task = asyncio.current_task()
    # The task object itself (not its id, which a later task may reuse); held only while
    # the lease is, and dropped on its last release.
    return (current_pid(), threading.get_ident(), task)


def _current_task_name() -> str | None:
    """The running asyncio task's name, or None outside a task (cheap when no loop runs)."""
    asyncio = sys.modules.get("asyncio")
    if asyncio is None or asyncio.events._get_running_loop() is None:
        return None
    task = asyncio.current_task()
    return None if task is None else task.get_name()


def _error_text(reply: object, node_timeout: float) -> str:
    if reply is TIMED_OUT:
        return f"no answer within {node_timeout * 1000:g} ms"
    return str(reply)


def _summarise(
    addresses: Iterable[NodeAddress],
    results: Sequence[Any],
    node_timeout: float,
    *,
    of_lease: bool = False,
) -> str:
    """The nodes that did not do their part, for a log line or an error.

    ``of_lease``: the results of a release or extend, where 1 means done and 0 not held;
    otherwise of an acquire, where an integer is another holder's milliseconds left.
    """
    parts = []
    for address, reply in zip(addresses, results, strict=True):
        if reply is TIMED_OUT or isinstance(reply, NodeError):
            parts.append(f"{address.label}: {_error_text(reply, node_timeout)}")
        elif reply == 0 and type(reply) is int:
            parts.append(f"{address.label}: not held")
        elif type(reply) is int and not of_lease:
            parts.append(f"{address.label}: held by another for {reply} ms")
    return "; ".join(parts) or "no errors"
