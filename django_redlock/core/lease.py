"""What a held lock is, whichever manager took it: :class:`BaseLease`.

:class:`~django_redlock.redlock.Lease` (sync) and :class:`~django_redlock.aredlock.AsyncLease`
(coroutines) add the I/O; the state, the checks that need no I/O, and how a release or an
extend round is judged and reported live here, once.

The lease object is the owner: its token lives here, not in a thread-local, so threads and
asyncio tasks can never share or overwrite each other's tokens.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, ClassVar, Final, Protocol, TypeGuard, TypeVar, cast

from django_redlock.core import extender, turns
from django_redlock.core.handle import LeaseHandle
from django_redlock.core.reentry import Reentry
from django_redlock.core.untracking import track_again
from django_redlock.exceptions import (
    LeaseInherited,
    LeaseNotExtended,
    LeaseReleased,
    LockLost,
)
from django_redlock.procedures import flow
from django_redlock.procedures.arguments import clip_origin
from django_redlock.procedures.shapes import Many, ReadWrite, Shape, Slots
from django_redlock.wire import process
from django_redlock.wire.process import current_pid
from django_redlock.wire.scripts import Command, release_command

__all__ = [
    "BaseLease",
    "Holder",
    "LeaseEvents",
    "LeaseHost",
    "cycle_free",
    "expired_before_renewal",
    "forget_in",
    "forget_scope",
    "held_on",
    "let_go",
    "lost_clean_up",
    "lost_error",
    "owns_round",
    "reenter",
    "release_quietly",
    "release_round",
    "renewal_basis",
    "renewal_lost",
    "renewal_missed",
    "renewal_round",
    "renewed",
    "settle_grant",
    "settle_release",
    "take_over",
]

_K = TypeVar("_K", bound="BaseLease")
_V = TypeVar("_V")

# The held-nodes tuples in use, one object each (see held_on); at most 2**N of them.
_HELD: dict[tuple[bool, ...], tuple[bool, ...]] = {}
_HELD_KEPT = 1024


def held_on(nodes: Iterable[bool]) -> tuple[bool, ...]:
    """``tuple(nodes)``, the same object for equal tuples: which nodes hold a lease, kept in
    every held lease's state (``BaseLease._state``, index 13), where a tuple per lease would
    be one more object per lease (it keeps the state tracked until a collection untracks it,
    and costs memory)."""
    held = tuple(nodes)
    shared = _HELD.get(held)
    if shared is not None:
        return shared
    if len(_HELD) < _HELD_KEPT:
        _HELD[held] = held
    return held


# A lease's own values, as ``BaseLease._state`` holds them (see there), and the index of each.
_State = tuple[
    str,  # NAME
    str,  # KEY
    str,  # TOKEN
    float,  # TTL
    float,  # ACQUIRED_AT
    str | None,  # ORIGIN
    str,  # OWNER: the owner record
    float,  # EXPIRES_AT
    str | None,  # MISSED
    str,  # WAITER
    int,  # TAKER_PID
    float | None,  # RENEW_UNTIL
    tuple[str, ...] | None,  # NAMES
    tuple[bool, ...] | None,  # HELD
    int | None,  # FENCING_TOKEN
]
NAME: Final = 0
KEY: Final = 1
TOKEN: Final = 2
TTL: Final = 3
ACQUIRED_AT: Final = 4
ORIGIN: Final = 5
OWNER: Final = 6
EXPIRES_AT: Final = 7
MISSED: Final = 8
WAITER: Final = 9
TAKER_PID: Final = 10
RENEW_UNTIL: Final = 11
NAMES: Final = 12
HELD: Final = 13
FENCING_TOKEN: Final = 14
_FIELDS = {
    "name": NAME,
    "key": KEY,
    "token": TOKEN,
    "ttl": TTL,
    "acquired_at": ACQUIRED_AT,
    "origin": ORIGIN,
    "owner": OWNER,
    "expires_at": EXPIRES_AT,
    "missed": MISSED,
    "waiter": WAITER,
    "taker_pid": TAKER_PID,
    "renew_until": RENEW_UNTIL,
    "names": NAMES,
    "held": HELD,
    "fencing_token": FENCING_TOKEN,
}


def replaced(state: _State, **changes: object) -> _State:
    """``state`` with the fields named in ``changes`` (``_FIELDS``' names) set anew: the one
    way a lease's state changes. A new tuple, never one changed in place, so it stays a
    tuple of atomics the collector untracks (see BaseLease's slots).

    Raises:
        KeyError: a name that is no field.
    """
    values: list[object] = list(state)
    for field, value in changes.items():
        values[_FIELDS[field]] = value
    return cast(_State, tuple(values))


def cycle_free(value: object) -> bool:
    """Whether ``value``, a lease held in a thread's or a task's scope, refers to nothing that
    can refer back to it, so that untracked it can hide no cycle from the collector.

    A sync :class:`~django_redlock.redlock.Lease` refers to: its engine, its scope's tuple
    (pid, thread id, and None or a weak reference to its asyncio task: see
    ``core.owner.owner_scope``), its shape (strings), its untracked state tuple (plain
    strings and numbers: names and origins are kept as plain ``str``, the fencing token as an
    ``int``) and its end (strings and a float), None, bools and small ints. The engine has
    no ``__dict__`` (nothing can be hung on it) and holds leases only weakly (the re-entry
    registry; the extender is the process's); what the user gave it is judged once, when it
    is built (``Engine.leases_untrackable``: see ``core.engine.reaches_no_lease``). An
    asyncio lease refers to the same, and to its asyncio manager only through a weak
    reference: that manager's connections hold the futures that tasks wait on, its loop's
    handles hold the tasks, and a task's frame may hold the lease, so a strong reference
    would close a cycle through it (see ``AsyncLease``)."""
    if not getattr(type(value), "_cycle_free_class", False):
        return False
    # The library's own shapes hold strings and numbers; a shape of the user's own (given to
    # acquire_shape) might hold anything.
    shape = value._special_shape  # type: ignore[attr-defined]
    if shape is not None and type(shape) not in _OWN_SHAPES:
        return False
    return bool(getattr(value._host, "leases_untrackable", False))  # type: ignore[attr-defined]


_OWN_SHAPES = frozenset({Shape, Slots, ReadWrite, Many})


class LeaseEvents(Protocol):
    """What a lease tells its host's reporter (:class:`~django_redlock.core.reporting.Reporter`
    is one; declared here so this module need not import it)."""

    def lost(self, lease: BaseLease, reason: str) -> None: ...

    def released(self, lease: BaseLease, held: float) -> None: ...

    def released_cleanly(self, lease: BaseLease, deleted: int, partial: str | None) -> None: ...

    def extended(self, lease: BaseLease, validity: float, votes: int) -> None: ...

    def handed_off(self, lease: BaseLease, held: float) -> None: ...

    def renewal_failed(self, lease: BaseLease, error: Exception) -> None: ...

    def renewal_missed(self, lease: BaseLease, error: LeaseNotExtended) -> None: ...

    def renewal_stopped(self, lease: BaseLease) -> None: ...

    def left_inherited(self, lease: BaseLease, child: int, owner: int) -> None: ...

    def release_failed_after_error(self, lease: BaseLease, error: Exception) -> None: ...


class LeaseHost(Protocol):
    """What a lease needs from its host, the engine both managers hold
    (:class:`~django_redlock.core.engine.Engine`), for sync and asyncio leases alike.

    Attributes:
        clock: the monotonic clock (seconds) of the lease's validity.
        reporter: told of what happens to the lease (loss, release, renewal, hand-off).
        nodes: the nodes, quorum and timing rules its rounds are judged by.
    """

    clock: Callable[[], float]

    @property
    def reporter(self) -> LeaseEvents: ...

    @property
    def nodes(self) -> flow.Nodes: ...

    def forget(self, lease: BaseLease) -> None:
        """Drop ``lease`` from the re-entry registry (released or handed off)."""

    def renew(self, lease: BaseLease) -> float:
        """One sync renewal round (the extender thread's, for asyncio leases too); the new
        validity in seconds. Raises what ``Lease.extend`` raises."""


class Holder(Protocol):
    """What a lease is made with: a manager, sync or asyncio, whose engine hosts it."""

    @property
    def engine(self) -> LeaseHost: ...


class BaseLease:
    """What :class:`~django_redlock.redlock.Lease` and
    :class:`~django_redlock.aredlock.AsyncLease` share: the state of a held lock and the
    checks that need no I/O. Not made directly; the two subclasses add ``extend``/``release``
    (plain or coroutines) and ``with`` or ``async with``.

    Attributes:
        name: the lock name (of ``lock_many``: its names, sorted, joined by ``" + "``).
        names: the lock names it holds (one but for ``lock_many``).
        key: the Redis key on every node.
        ttl: the lease length in seconds.
        origin: where it was taken (free text for operators), or None.
        acquired_at: when it was taken, on the manager's monotonic clock (seconds).
        fencing_token: the database-minted fencing token, or ``None`` when not fenced.
    """

    # Slots, no __dict__: a process may hold tens of thousands of leases, and every full
    # garbage collection visits each of them and each object they refer to (see
    # test_lease_footprint.py and benchmarks/gc_pause.py). So a held lease has few slots, and
    # what is its own (strings, floats: each one more object to visit, and a cache miss at
    # that) lives in one tuple of atomics, ``_state``, which the collector does not track:
    # the other slots refer only to objects shared by many leases (the engine, None, small
    # ints, the owner scope's tuple) while the lease is plain. Which nodes hold it is in
    # ``_state`` too (a shared tuple of bools: see held_on), not a slot: every slot is a
    # reference each collection visits twice, None or not. No attribute of a lease refers back to
    # it, so a dropped lease is freed by reference counting alone.
    # Whether a lease of this class, held, refers to nothing that can refer back to it
    # (see cycle_free): the sync Lease's does not; an asyncio lease's manager might.
    _cycle_free_class: ClassVar[bool] = False

    __slots__ = (
        "__weakref__",  # the re-entry registry and the extender hold leases weakly
        "_depth",  # holds by the owner (re-entries); 0 once released
        "_end",  # None, or once it was found lost: (reason, cause, at on the host's clock)
        "_guard",  # auto-extended leases only: whose turn it is (see __init__)
        "_host",
        "_scope",
        "_special_shape",
        "_state",
    )

    # What ``_state`` holds, by the index names above _State: NAME, KEY, TOKEN, TTL,
    # ACQUIRED_AT, ORIGIN never change; OWNER (the owner record) is set by the grant (or
    # once by the first renewal of an adopted lease); EXPIRES_AT (host clock, seconds) and
    # MISSED (why the last renewal reached no quorum, or None) by each renewal; WAITER (the
    # blocking acquire's waiter id, or ""), TAKER_PID (the process that took it),
    # RENEW_UNTIL (a time.monotonic() instant, or None), NAMES (lock_many's, or None) once,
    # before the lease is its owner's (names: in its turn); HELD (which nodes hold it: see
    # __init__) by the grant and each renewal that reaches a quorum; FENCING_TOKEN (None, or
    # the int the database minted: see fencing_token) once, by its owner, in its turn. The
    # tuple is replaced whole (replaced()), never changed in place; once the lease is its
    # owner's, only by a renewal (or those two setters), which the lease's turn
    # (core.turns) serialises with the owner's extend when the lease is auto-extended (only
    # the owner renews it otherwise), so no update is lost.

    def __init__(
        self,
        manager: Holder,
        name: str,
        key: str,
        token: str,
        ttl: float,
        expires_at: float,
        acquired_at: float,
        origin: str | None = None,
        shape: Shape | None = None,
        owner: str = "",
        waiter: str = "",
        held: tuple[bool, ...] | None = None,
    ) -> None:
        # ``owner``, ``waiter``, ``held``: what the round that granted the lease left, as
        # settle_grant records them (given here by a grant, the state is built once).
        # Positional or keyword: the engine's grant passes them by position, since eleven
        # keyword arguments cost more than the rest of this call (about 4,000 instructions
        # per acquire, measured with callgrind on CPython 3.11: benchmarks/steps.py).
        # The manager's engine, not the manager: one host for the leases of every manager
        # sharing it, and the attribute read here costs less than a subclass __init__ would.
        self._host = manager.engine
        # What the lease is on the nodes (see procedures/shapes.py and _shape): None for a lock
        # on ``key``, the common case, whose shape is made again for each round.
        self._special_shape = (
            None if shape is None or (type(shape) is Shape and shape.key == key) else shape
        )
        self._state: _State = (
            name,
            key,
            token,
            ttl,
            acquired_at,
            None if origin is None else clip_origin(origin),
            owner,  # the owner record: see _owner
            expires_at,
            None,
            waiter,
            # The process that took the lease owns it; a forked child has a copy of this
            # object but not the lease (see _refuse_inherited). process.PID: a load, where
            # current_pid() is a call.
            process.PID,
            None,
            None,
            # HELD: which nodes held the lease after the round that granted or last
            # renewed it (None: not known, every node), for judge_extend to tell a lost key
            # from one never granted. A tuple of bools shared by the leases held on the same
            # nodes (see held_on), so _state stays a tuple the collector does not track (a
            # new one is untracked by the same collection as _state).
            held,
            None,
        )
        self._depth = 1
        self._end: tuple[str, str, float] | None = None
        # Auto-extended leases only (else None): whose turn it is, False (free) or True
        # (taken), which serialises the extender's renewals with the owner's extend, release
        # and setters, so a renewal never races a release into a false "lost" (core.turns).
        self._guard: bool | None = None
        self._scope: tuple[object, ...] | None = None

    @property
    def host(self) -> LeaseHost:
        """The engine that hosts the lease (its clock, reporter and nodes; see
        :class:`LeaseHost`), shared by the managers that hold that engine."""
        return self._host

    @property
    def name(self) -> str:
        """The lock name (of ``lock_many``: its names, sorted, joined by ``" + "``)."""
        return self._state[NAME]

    @property
    def key(self) -> str:
        """The Redis key on every node."""
        return self._state[KEY]

    @property
    def ttl(self) -> float:
        """The lease length in seconds."""
        return self._state[TTL]

    @property
    def acquired_at(self) -> float:
        """When the lease was taken, on the manager's monotonic clock (seconds)."""
        return self._state[ACQUIRED_AT]

    @property
    def origin(self) -> str | None:
        """Where the lease was taken (free text for operators), or None."""
        return self._state[ORIGIN]

    @property
    def _owner(self) -> str:
        """The owner record stored with the keys (JSON; never the token): what a renewal
        stores where it re-creates a key a node lost. Set by the acquire; made on first use
        for a lease built otherwise (adopted, or from a Celery message); "" until then."""
        return self._state[OWNER]

    @_owner.setter
    def _owner(self, owner: str) -> None:
        self._state = replaced(self._state, owner=owner)

    @property
    def _expires_at(self) -> float:
        """When the validity runs out, on the host's clock (seconds)."""
        return self._state[EXPIRES_AT]

    @property
    def _missed(self) -> str | None:
        """Why the last renewal reached no quorum (None after a successful one): the words
        of the loss if the validity runs out before a renewal gets through."""
        return self._state[MISSED]

    @property
    def _pid(self) -> int:
        """The process that took the lease (see :attr:`inherited`)."""
        return self._state[TAKER_PID]

    @property
    def _released(self) -> bool:
        return self._depth == 0

    @property
    def _lost_reason(self) -> str | None:
        end = self._end
        return None if end is None else end[0]

    @property
    def _lost_cause(self) -> str:
        end = self._end
        return "" if end is None else end[1]

    @property
    def _lost_at(self) -> float | None:
        end = self._end
        return None if end is None else end[2]

    @property
    def _shape(self) -> Shape:
        """What the lease is on the nodes: its commands for each round."""
        shape = self._special_shape
        return Shape(self._state[KEY]) if shape is None else shape

    @property
    def names(self) -> tuple[str, ...]:
        """The lock names the lease holds, sorted: ``(name,)`` but for ``lock_many``."""
        state = self._state
        names: tuple[str, ...] | None = state[NAMES]
        return (state[NAME],) if names is None else names

    @names.setter
    def names(self, names: tuple[str, ...]) -> None:
        # Set by lock_many once the lease is its owner's: the extender may already renew it,
        # so in its turn, lest this and a renewal each replace _state and one be lost.
        if self._guard is None:
            self._state = replaced(self._state, names=names)
            return
        turns.take(self)
        try:
            self._state = replaced(self._state, names=names)
        finally:
            turns.give_back(self)

    @property
    def fencing_token(self) -> int | None:
        """The database-minted fencing token, or ``None`` when not fenced."""
        return self._state[FENCING_TOKEN]

    @fencing_token.setter
    def fencing_token(self, token: object) -> None:
        # In _state, not a slot of its own: one reference fewer for every collection to visit
        # in every lease, and a fenced lease's token (an int of its own, above the cached
        # small ones) is not one more object to read. Set by its owner once the lease is
        # its owner's (the extender may renew it meanwhile): in its turn, as names.
        # A plain int, copied: anything else in the state could refer back to the lease,
        # which may be untracked (see cycle_free), and would keep the state tracked.
        if token is not None:
            if not isinstance(token, int) or isinstance(token, bool):
                raise TypeError(f"fencing_token must be an int or None, not {token!r}")
            token = int(token)
        if self._guard is None:
            self._state = replaced(self._state, fencing_token=token)
            return
        turns.take(self)
        try:
            self._state = replaced(self._state, fencing_token=token)
        finally:
            turns.give_back(self)

    @property
    def token(self) -> str:
        """The random lease token. A bearer secret: never logged, never shown."""
        return self._state[TOKEN]

    def __repr__(self) -> str:
        state = "released" if self._released else "lost" if self.lost else "held"
        if self.inherited:
            state += f" by process {self._pid} (inherited)"
        return f"<{type(self).__name__} {self.name!r} {state}, validity={self.validity:.3f}s>"

    @property
    def kind(self) -> str:
        """What the lease is: ``"lock"``, ``"semaphore"``, ``"read"``, ``"write"`` or
        ``"many"`` (``lock_many``)."""
        return self._shape.kind

    @property
    def slot(self) -> int | None:
        """The slot a semaphore lease holds (0 … limit - 1), else None."""
        return self._shape.slot

    @property
    def validity(self) -> float:
        """Seconds the lease is still known valid by the local monotonic clock (≥ 0); 0 once
        it was found lost (a quorum no longer holds it), whatever time its last renewal
        left."""
        if self._end is not None:
            return 0.0
        return max(0.0, self._state[EXPIRES_AT] - self._host.clock())

    def remaining(self) -> float:
        """Seconds of validity left by the local monotonic clock (≥ 0): :attr:`validity`, as
        a method. Asks no node; see ``owned()`` for that."""
        return self.validity

    @property
    def lost(self) -> bool:
        """True once the lease may no longer be held: its validity ran out, or a round found a
        quorum of nodes no longer holding it (see :attr:`lost_cause`). A renewal that merely
        failed to reach a quorum does not make it lost. A released lease is not lost."""
        if self._depth == 0:
            return False
        return self._end is not None or self._state[EXPIRES_AT] <= self._host.clock()

    @property
    def lost_cause(self) -> str | None:
        """Why the lease ended: ``"expired"`` (its validity ran out), ``"taken"`` (a quorum
        of nodes holds it for another token) or ``"gone"`` (a quorum no longer holds it);
        None while it has not (and for a lease released while it still held). Kept after a
        release that found it lost."""
        end = self._end
        if end is not None:
            return end[1] or flow.EXPIRED
        if self._depth != 0 and self._state[EXPIRES_AT] <= self._host.clock():
            return flow.EXPIRED
        return None

    @property
    def lost_at(self) -> float | None:
        """When the lease ended, on the manager's monotonic clock (seconds): for an expired
        lease the instant its validity ran out, otherwise when a round found it lost; None
        while :attr:`lost_cause` is None."""
        if self.lost_cause is None:
            return None
        end = self._end
        return self._state[EXPIRES_AT] if end is None else end[2]

    @property
    def released(self) -> bool:
        """True once ``release()`` was called on this lease."""
        return self._depth == 0

    @property
    def inherited(self) -> bool:
        """True in a process forked from the lease's owner: there the lease cannot be
        released, extended or checked (:class:`LeaseInherited`)."""
        return self._state[TAKER_PID] != current_pid()

    @property
    def auto_extended(self) -> bool:
        """True while a background thread renews this lease (see ``auto_extend``)."""
        return self._guard is not None and self._depth != 0 and self._end is None

    @property
    def depth(self) -> int:
        """How many times the owner holds it (re-entries in the same thread or task)."""
        return self._depth

    def check(self) -> None:
        """Raise unless the lease is still valid.

        Raises:
            LeaseReleased: the lease was released.
            LockLost: the lease expired or was found lost.
            LeaseInherited: called in a forked child (it cannot know its parent's lease).
        """
        self._refuse_inherited()
        if self._depth == 0:
            raise LeaseReleased(self.name)
        if self._end is None:
            expires_at = self._state[EXPIRES_AT]
            if expires_at > self._host.clock():
                return
            self._mark_lost(self._expiry_reason(), flow.EXPIRED, expires_at)
        raise self._lost_error()

    def handle(self) -> LeaseHandle:
        """Give this lease to another process: returns a :class:`LeaseHandle` (picklable;
        ``.dumps()`` for text) that ``m.adopt(handle)`` there turns into a lease of its own.

        This process lets go at once, with no I/O: the lease counts as released here
        (auto-extension stops, ``check()`` raises ``LeaseReleased``, leaving its ``with``
        block releases nothing), and once adopted its token is refused on the nodes, so a
        late release from here can never delete the adopter's keys. If nobody adopts it, the
        keys run out within the lease's validity.

        Raises:
            LeaseReleased: released (or handed off) already.
            LockLost: the lease expired or was found lost: nothing to hand over.
            LeaseInherited: called in a forked child.
            TypeError: the lease is not a lock's (a semaphore slot, a read or write lease,
                several locks): only a lock's lease can be handed off.
        """
        if not self._shape.handoff:
            raise TypeError(f"a {self._shape.kind} lease cannot be handed off, only a lock's")
        self.check()
        handle = LeaseHandle(
            name=self.name,
            key=self.key,
            token=self.token,
            ttl=self.ttl,
            fencing_token=self.fencing_token,
        )
        # Not in its turn: a renewal in flight may still extend the old token's keys, which only
        # gives the adopter more time; the extender starts no renewal of a released lease.
        let_go(self)
        self._host.forget(self)
        self._host.reporter.handed_off(self, self._host.clock() - self.acquired_at)
        return handle

    def renew_once(self) -> float | None:
        """One renewal round by the extender thread (``core/extender.py``), for sync and
        asyncio leases alike; returns when the next one is due (a ``time.monotonic()``
        instant), or None to stop renewing (released, lost, or ``max_hold`` reached).

        A renewal that reaches no quorum (:class:`LeaseNotExtended`) leaves the lease as
        valid as it was and is tried again, sooner as the validity left shrinks, and once
        more at the instant it runs out, so that the loss is reported then (``lock_lost``)
        and not at the next scheduled renewal. It never raises.
        """
        if self._guard is None:
            return None
        turns.take(self)
        try:
            if self._depth == 0 or self._end is not None:
                return None
            reporter = self._host.reporter
            until = self._state[RENEW_UNTIL]
            if until is not None and time.monotonic() >= until:
                reporter.renewal_stopped(self)
                return None
            try:
                self._host.renew(self)
            except (LockLost, LeaseReleased) as error:
                reporter.renewal_failed(self, error)
                return None
            except LeaseNotExtended as error:
                reporter.renewal_missed(self, error)
                return time.monotonic() + self._retry_in(error.validity)
        finally:
            turns.give_back(self)
        return time.monotonic() + self.ttl / 3

    def _retry_in(self, left: float) -> float:
        """Seconds until the next renewal after one that reached no quorum, with ``left``
        seconds of validity: a third of what is left (so several tries fit before it runs
        out), at least 50 ms apart, never later than the instant it runs out, nor later
        than the usual ``ttl / 3``."""
        return min(self.ttl / 3, left, max(left / 3, 0.05))

    # -- for the two lease types ----------------------------------------------------------

    def _refuse_inherited(self) -> None:
        """Raise :class:`LeaseInherited` in a forked child.

        Checked before anything else, the lease's turn included: the parent's extender thread
        may have had the turn at the instant of the fork, and the child's copy of it then stays
        taken forever (core.turns).
        """
        pid = self._state[TAKER_PID]
        if pid != current_pid():
            raise LeaseInherited(self.name, pid, current_pid())

    def _left_inherited(self) -> bool:
        """True (with a warning) when a ``with`` block of this lease ends in a forked child,
        which must leave the parent's keys alone (sync and asyncio alike)."""
        pid = self._state[TAKER_PID]
        if pid == current_pid():
            return False
        self._host.reporter.left_inherited(self, current_pid(), pid)
        return True

    def _mark_lost(self, reason: str, cause: str, at: float | None = None) -> None:
        """Record once that the lease ended (``cause`` as ``LockLost.cause``; ``at`` on the
        manager's clock, now when not given) and report it."""
        if self._end is None:
            self._end = (reason, cause, self._host.clock() if at is None else at)
            self._host.reporter.lost(self, reason)

    def _lost_error(self) -> LockLost:
        """The :class:`LockLost` of this lease's end (also after its release noticed it)."""
        end = self._end
        if end is None:  # not marked lost (yet): it can only have run out
            return LockLost(self.name, self._expiry_reason(), flow.EXPIRED, self._state[EXPIRES_AT])
        return LockLost(self.name, end[0] or self._expiry_reason(), end[1] or flow.EXPIRED, end[2])

    def _expiry_reason(self) -> str:
        missed = self._state[MISSED]
        if missed is not None:
            return (
                "the lease expired: its validity ran out before a renewal reached a quorum "
                f"(last: {missed})"
            )
        return "the lease expired: its validity ran out"

    def _end_hold(self) -> bool:
        """The owner lets go once: True when the keys must now be released (the last exit),
        False when an inner re-entry ended (the keys stay until the last exit).

        Raises:
            LeaseReleased: released already.
        """
        depth = self._depth
        if depth == 0:
            raise LeaseReleased(self.name)
        if depth > 1:
            self._depth = depth - 1
            return False
        # Released from now on, whatever happens to the round: the extender starts no more
        # renewals of it, and a second release raises.
        let_go(self)
        self._host.forget(self)
        return True

    def _settle_release(self, results: Sequence[Any], deleted: int, expired: bool) -> None:
        """Judge and report a release round: ``deleted`` nodes held the key; ``expired``
        whether the lease had run out before it.

        Raises:
            LockLost: the lease had expired, or too many nodes no longer held it.
        """
        host = self._host
        verdict = flow.judge_release(host.nodes, results, deleted, expired)
        host.reporter.released(self, host.clock() - self._state[ACQUIRED_AT])
        if verdict.lost is not None:
            cause = flow.EXPIRED if expired else flow.GONE
            self._mark_lost(verdict.lost, cause, self._state[EXPIRES_AT] if expired else None)
            raise self._lost_error()
        host.reporter.released_cleanly(self, deleted, verdict.partial)

    def _expired_before_renewal(self) -> bool:
        """True (the lease now marked lost) when its validity ran out before a renewal round
        could start: no round is sent then. A renewal re-creates keys a node lost; sent for
        a lease already ended it would only set keys that the clean-up must delete again."""
        expires_at = self._state[EXPIRES_AT]
        if expires_at > self._host.clock():
            return False
        self._mark_lost(self._expiry_reason(), flow.EXPIRED, expires_at)
        return True

    def _renewal_basis(self) -> tuple[float, float, tuple[bool, ...] | None]:
        """What a renewal of this lease is judged against (``flow.judge_extend``): its ttl
        in seconds, when its validity runs out (host clock), and which nodes hold it (None:
        every node)."""
        s = self._state
        return s[TTL], s[EXPIRES_AT], s[HELD]

    def _renewal_missed(self, missed: flow.Missed, now: float) -> LeaseNotExtended:
        """A renewal round decided at ``now`` that decided nothing: recorded (the lease
        keeps its validity and its keys); returns the error to raise."""
        s = self._state
        self._state = replaced(s, missed=missed.reason)
        return LeaseNotExtended(
            self.name,
            missed.renewed,
            self._host.nodes.quorum,
            missed.node_errors,
            max(0.0, s[EXPIRES_AT] - now),
            missed.refused,
            missed.reason,
        )

    def _renewal_lost(self, lost: flow.Lost, now: float) -> LockLost:
        """A renewal round decided at ``now`` found the lease ended: marked lost (the
        caller frees the keys ``flow.lost_clean_up`` names); returns the error to raise."""
        s = self._state
        expired = lost.cause == flow.EXPIRED
        missed = s[MISSED]
        if expired and missed is not None:
            reason = f"{lost.reason}; the renewal before: {missed}"
        else:
            reason = lost.reason
        self._mark_lost(reason, lost.cause, s[EXPIRES_AT] if expired else now)
        return self._lost_error()

    def _renewed(self, validity: float, now: float, results: Sequence[Any]) -> float:
        """A renewal round decided at ``now`` kept the lease for ``validity`` more seconds:
        recorded and reported; returns ``validity``."""
        s = self._state
        held = held_on(flow.held_after_renewal(s[HELD], results))
        self._state = replaced(s, expires_at=now + validity, missed=None, held=held)
        tally = flow.extend_tally(results)
        self._host.reporter.extended(self, validity, tally.renewed + tally.recreated)
        return validity

    def _block_ended(
        self,
        exc: BaseException | None,
        lost: str | None,
        release_error: LockLost | LeaseReleased | None,
    ) -> None:
        """After the release that ends a ``with`` block (sync or async): ``exc`` the block's
        own exception, ``lost`` the lease's loss noticed before the release.

        Raises:
            LockLost: the block ended normally but the lease was lost (it may have overlapped
                another holder), found at release or earlier (a failed renewal). The block's
                own exception is never hidden behind the release's: that is logged.
        """
        if release_error is not None:
            if exc is None:
                raise release_error
            self._host.reporter.release_failed_after_error(self, release_error)
            return
        if exc is None and lost is not None:
            raise self._lost_error()


# -- what the engine and the managers do to a lease -------------------------------------
# Functions, not lease methods: they are the lease's side of its host's steps and rounds
# (core/engine.py, core/manager.py, core/amanager.py), not part of what users call on a
# lease; they live here, with the state they change.


def reenter(lease: BaseLease, kind: type[_K]) -> TypeGuard[_K]:
    """Count one more hold of ``lease`` by its owner (re-entry) when it is a ``kind`` that
    is still held (not released, not lost); False, changing nothing, otherwise."""
    if isinstance(lease, kind) and lease._depth != 0 and not lease.lost:
        lease._depth += 1
        return True
    return False


def settle_grant(lease: BaseLease, owner: str, held: tuple[bool, ...], waiter: str = "") -> None:
    """Record what the round that granted (or handed over) ``lease`` left: its owner record
    ("" when not known yet: made at its first renewal), which nodes hold it, and the waiter
    id whose place in line its release drops."""
    lease._state = replaced(lease._state, owner=owner, waiter=waiter, held=held)


def take_over(
    lease: BaseLease,
    scope: tuple[object, ...],
    auto_extend: bool,
    hold: float | None,
    registry: Reentry[BaseLease],
) -> None:
    """Make ``lease`` the property of ``scope`` (pid, thread, task), renewed in the
    background when ``auto_extend`` (until ``hold`` seconds from now, when given), and
    registered in ``registry`` for re-entry when its shape is re-entrant."""
    if auto_extend:
        # Its turn is free (core.turns): a flag, not a lock of its own, so an auto-extended
        # lease is no more for a collection to read than a plain one.
        lease._guard = False
        if hold is not None:
            s = lease._state
            lease._state = replaced(s, renew_until=time.monotonic() + hold)
        # A third of what the lease has left, not of its ttl: an adopted lease keeps only the
        # validity its giver had, which may be less than ttl / 3 (it would run out before its
        # first renewal). For a new lease the two are all but equal.
        extender.schedule(lease, time.monotonic() + min(lease.ttl, lease.validity) / 3)
    lease._scope = scope
    # A plain lock (no special shape) is re-entrant: no Shape is built to ask it.
    shape = lease._special_shape
    if shape is None or shape.reentrant:
        # The registry's tuple for this scope, equal to ``scope``: one shared by all the
        # leases the scope holds (an asyncio task's holds a weak reference to the task, so
        # the collector tracks it: one per task, not one per lease).
        lease._scope = registry.put(scope, lease._state[NAME], lease)


def let_go(lease: BaseLease) -> None:
    """End ``lease``'s hold (released, handed off, or never got by its owner because its
    acquire failed after the grant): it counts as released, so the extender renews it no
    more. Tracked again by the collector first, if the registry untracked it (see
    track_again): no interruption between the two leaves a lease no longer held untracked."""
    track_again(lease)
    lease._depth = 0


def forget_in(registry: Reentry[BaseLease], lease: BaseLease) -> None:
    """Drop ``lease`` from ``registry`` (the engine's re-entry registry) if it is registered
    there (released, handed off, or let go): one call on every release, so the lease's scope
    and name are read here rather than through their accessors."""
    scope = lease._scope
    if scope is not None:
        registry.remove(scope, lease._state[NAME], lease)


def forget_scope(lease: BaseLease) -> tuple[object, ...] | None:
    """The scope ``lease`` is registered under for re-entry, or None (never owned)."""
    return lease._scope


def renewal_round(
    lease: BaseLease, size: int, record: Callable[[str | None], str]
) -> list[Command]:
    """The commands of a renewal round of ``lease`` on ``size`` nodes: renew, or re-create
    where a node lost the key, with the lease's owner record (made by ``record`` from its
    origin when it has none yet: an adopted lease)."""
    if not lease._owner:
        lease._owner = record(lease.origin)
    return flow.extend_round(size, lease._shape, lease.token, lease.ttl, lease._owner)


def expired_before_renewal(lease: BaseLease, size: int) -> list[Command | None] | None:
    """None while ``lease`` is valid. Once its validity ran out before a renewal could start
    (no round is sent then): the lease is marked lost, and this returns the releases of its
    keys to send before raising :func:`lost_error`."""
    if not lease._expired_before_renewal():
        return None
    return lease._shape.clean_up(lease.token, None, size)


def lost_clean_up(lease: BaseLease, results: Sequence[Any]) -> list[Command | None]:
    """After :func:`renewal_lost` marked the lease lost: the releases its round's ``results``
    call for (see :func:`flow.lost_clean_up <django_redlock.procedures.flow.lost_clean_up>`)."""
    return flow.lost_clean_up(lease._shape, lease._state[TOKEN], lease._lost_cause, results)


def release_round(lease: BaseLease, size: int) -> tuple[list[Command], object, bool, bool]:
    """The release round of ``lease`` on ``size`` nodes: its commands, the reply that counts
    as released, whether the lease had run out before it (for :func:`settle_release`), and
    whether the commands take the connection's identity (send them with that ``identify``:
    see :meth:`~django_redlock.procedures.shapes.Shape.held_release`)."""
    s = lease._state
    expired = s[EXPIRES_AT] <= lease._host.clock()
    shape = lease._special_shape
    if shape is None:
        # A plain lock: what Shape(key).held_release sends, without building the Shape
        # (two calls fewer on every release).
        return [release_command(s[KEY], s[TOKEN], s[WAITER], True)] * size, 1, expired, True
    commands = [shape.held_release(s[TOKEN], s[WAITER])] * size
    return commands, shape.release_yes, expired, shape.release_identified


def owns_round(lease: BaseLease, size: int) -> list[Command]:
    """The commands that ask ``size`` nodes whether they hold ``lease``'s token."""
    return flow.owns_round(size, lease._shape, lease.token)


lost_error = BaseLease._lost_error
"""``lost_error(lease)``: the :class:`LockLost` of the lease's end."""
settle_release = BaseLease._settle_release
"""``settle_release(lease, results, deleted, expired)``: judge and report a release round
(raises ``LockLost``: see ``BaseLease._settle_release``)."""
renewal_basis = BaseLease._renewal_basis
"""``renewal_basis(lease)``: (ttl, expires_at, held), what a renewal is judged against."""
renewal_missed = BaseLease._renewal_missed
"""``renewal_missed(lease, missed, now)``: record a renewal that decided nothing; the
``LeaseNotExtended`` to raise."""
renewal_lost = BaseLease._renewal_lost
"""``renewal_lost(lease, lost, now)``: mark the lease lost; the ``LockLost`` to raise."""
renewed = BaseLease._renewed
"""``renewed(lease, validity, now, results)``: record and report a renewal that kept the
lease; returns ``validity``."""


class _Releasable(Protocol):
    @property
    def name(self) -> str: ...

    def release(self) -> None: ...


def release_quietly(lease: _Releasable, what: str, logger: logging.Logger) -> None:
    """Release ``lease`` after an error of the caller's (whose error is what must be seen): a
    lease already lost or released is logged on ``logger`` as ``what``, not raised."""
    try:
        lease.release()
    except (LockLost, LeaseReleased) as error:
        logger.warning("releasing %s %r after an error: %s", what, lease.name, error)
