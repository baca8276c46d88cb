"""What one kind of lease looks like on the nodes: a lock, a semaphore slot, a read or a
write lease of a read-write lock, or several locks at once.

A shape builds the commands of every round of its lease (acquire, release, extend, owns,
leave the line) and says how an acquire round is voted; the Redlock steps
(``procedures/flow.py``) and both managers run every shape the same way: same quorum, same
validity with drift, same retry, clean-up and restart rules. Plain objects over command
builders (``wire/scripts.py``, ``wire/primitives.py``): no I/O.

One shape per acquire: a semaphore's shape remembers the slot its quorum granted (the slot
its lease then renews and checks) and, between tries, the slot most nodes answered.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from django_redlock.wire import primitives
from django_redlock.wire.errors import PENDING, TIMED_OUT, NodeError, NotSent
from django_redlock.wire.scripts import (
    GRANTED,
    Command,
    acquire_command,
    extend_command,
    leave_command,
    owns_command,
    release_command,
)

__all__ = ["Many", "Mutex", "ReadWrite", "Shape", "SlotDecider", "Slots", "lock_refusal"]


def lock_refusal(reply: object) -> int | None:
    """A lock's refusal (``acquire.lua``): an integer, the ms the holder has left."""
    return reply if type(reply) is int else None


def heard(reply: object) -> bool:
    """Whether what a command did on a node is known from its reply: not for a timeout, a
    reply not waited for, or an I/O error; known for a command that never left (NotSent)
    and for a QUARANTINED refusal (the vote gate runs before any write in every granting
    script, so such a node wrote nothing)."""
    if reply is PENDING or reply is TIMED_OUT:
        return False
    if isinstance(reply, NotSent):
        return True
    if isinstance(reply, NodeError):
        return str(reply).startswith("QUARANTINED")
    return True


class Shape:
    """A lock (the base shape): one hash per node under ``key`` (``scripts/acquire.lua``).

    Attributes:
        key: the lease's key on every node (a lock's, or the base key of a semaphore).
        kind: what the lease is, for logs, signals and operators: ``"lock"``,
            ``"semaphore"``, ``"read"``, ``"write"`` or ``"many"``.
        wake_key: the base of the pub/sub channels a waiter hears its turn on, or None for
            a shape whose blocking acquires never queue (they poll).
        reentrant: the same thread or task taking it again re-enters the lease it holds.
        handoff: ``lease.handle()`` may give the lease to another process.
        release_yes: a node's reply to a release that freed the whole lease there.
        release_identified: the holder's release (:meth:`held_release`) takes the
            connection's identity: send it with ``identify=True``, and only then.
    """

    kind = "lock"
    slot: int | None = None  # a semaphore lease's slot (see Slots)
    reentrant = True
    handoff = True
    release_yes: object = 1
    release_identified = True

    # One shape per held lease: slots keep it small for the garbage collector.
    __slots__ = ("key", "wake_key")

    def __init__(self, key: str) -> None:
        self.key = key
        self.wake_key: str | None = key

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.kind} {self.key!r}>"

    # -- acquire ----------------------------------------------------------------------------

    def acquire(
        self,
        token: str,
        ttl: float,
        owner: str,
        quarantine_ms: int,
        waiter: str,
        ticket: int,
        lifetime_ms: int,
        hand_round: int = 0,
    ) -> Command:
        """The command of one acquire try on every node (post it with ``identify=True``);
        ``ttl`` in seconds, the rest as ``acquire_command`` takes them (``hand_round``: the
        round of a waiter taking hand-off grants, ``scripts/hand_register.lua``)."""
        return acquire_command(
            self.key,
            token,
            math.ceil(ttl * 1000),
            owner,
            quarantine_ms,
            waiter,
            ticket,
            lifetime_ms,
            hand_round,
        )

    def decider(self, quorum: int) -> object:
        """The ``yes_value`` of an acquire round (a reply equal to it is a yes vote)."""
        return GRANTED

    def granted_on(self, results: Sequence[Any]) -> tuple[bool, ...]:
        """Which nodes may hold the lease after a won acquire round (its replies, in order):
        those that granted it, and those whose answer was not heard (the round returned at
        a quorum, or they timed out: their SET may have landed). Only a refusal says no."""
        size = len(results)
        if results.count(GRANTED) + results.count(PENDING) == size:
            return (True,) * size  # the usual round: counted in C, no call per node
        return tuple(reply == GRANTED or not heard(reply) for reply in results)

    def need(self, quorum: int) -> int:
        """How many yes votes decide an acquire round."""
        return quorum

    def votes(self, results: Sequence[Any], yes: int) -> int:
        """How many nodes granted the lease in a round that counted ``yes`` yes votes."""
        return yes

    def refused_ms(self, reply: object) -> int | None:
        """A node's refusal as the ms until what blocks the lease there runs out (-1: no
        expiry; 0: waiters ahead), or None when ``reply`` is no refusal (a grant, an error)."""
        return lock_refusal(reply)

    def won(self, token: str, results: Sequence[Any]) -> list[Command | None] | None:
        """After a round won: the releases of grants outside the lease (a semaphore's other
        slots), one per node, or None when there are none."""
        return None

    def clean_up(
        self, token: str, results: Sequence[Any] | None, size: int
    ) -> list[Command | None]:
        """The release after a failed acquire round (or an interrupted one, ``results``
        None, or a lease found lost): on every node its command may have reached, the failed
        ones included, since a timed-out command may still have landed. A node that refused
        wrote nothing of ours, and one the command never reached (``NotSent``) has nothing to
        undo."""
        command = self.release(token, "")
        if results is None:
            return [command] * size
        return self._where_tried(command, results)

    def _where_tried(self, command: Command, results: Sequence[Any]) -> list[Command | None]:
        """``command`` on every node a failed round's try may have written to: all but those
        that refused it (they wrote nothing of ours) and those it never reached."""
        return [
            None if self.refused_ms(reply) is not None or isinstance(reply, NotSent) else command
            for reply in results
        ]

    def retry_clean_up(self, token: str, results: Sequence[Any], size: int) -> list[Command | None]:
        """The clean-up of a failed round of a blocking acquire that goes on waiting:
        :meth:`clean_up`, unless the shape keeps the waiter's place (:class:`Slots`)."""
        return self.clean_up(token, results, size)

    # -- a held lease -----------------------------------------------------------------------

    def release(self, token: str, waiter: str) -> Command:
        """Free the lease where it holds ``token``, and drop ``waiter``'s place in line."""
        return release_command(self.key, token, waiter)

    def held_release(self, token: str, waiter: str) -> Command:
        """The holder's release round's command: :meth:`release`, completed by the
        connection's identity when :attr:`release_identified` (a lock's release that hands
        the lock over then names the server process its connection reached, so the node
        needs no ``INFO`` call to know it is the process that recorded the line; see
        ``scripts/hand_grant.lua``)."""
        if self.release_identified:
            return release_command(self.key, token, waiter, identified=True)
        return self.release(token, waiter)

    def extend(self, token: str, ttl: float, owner: str) -> Command:
        """Renew the lease to ``ttl`` seconds where it holds ``token``, or re-create it where a
        node lost it (``owner``: the owner record it then stores). Reply 1 renewed, 2
        re-created, -1 held by another here."""
        return extend_command(self.key, token, math.ceil(ttl * 1000), owner)

    def owns(self, token: str) -> Command:
        """Does a node still hold the lease for ``token``; reply 1 or 0."""
        return owns_command(self.key, token)

    def leave(self, waiter: str, token: str = "", gone: bool = False) -> Command | None:
        """Drop ``waiter``'s place in the line (None: this shape never queues); with
        ``token``, a waiter's hand-off token, also free the lock where it holds it
        (``scripts/leave.lua``); with ``gone``, a waiter taking grants whose try there may
        not have run yet, leave the mark that refuses that try (``scripts/hand_gone.lua``;
        only a lock's waiters take grants: the other shapes ignore it)."""
        return leave_command(self.key, waiter, token, gone)


Mutex = Shape
"""A lock: the base shape."""


class SlotDecider:
    """The ``yes_value`` of a semaphore acquire round: each node grants a slot, and only a
    slot granted by a quorum is held (each slot is a Redlock mutex of its own).

    Both transports count a reply as a yes vote when ``reply == yes_value``; every reply
    type they record (lists, bytes, ints, errors) leaves the comparison to this object's
    ``__eq__``. It answers True once, for the reply that decides the round: the one that
    brings a slot to a quorum, or the one after which no slot can reach a quorum any more
    (so a hung minority does not hold up a refused try). The round's outcome is judged
    from its results afterwards (:meth:`Slots.votes`), never from this object.
    """

    __slots__ = ("counts", "decided", "left", "quorum")

    def __init__(self, size: int, quorum: int) -> None:
        self.quorum = quorum
        self.left = size
        self.counts: dict[int, int] = {}
        self.decided = False

    def __eq__(self, reply: object) -> bool:
        if self.decided:
            return False
        self.left -= 1
        slot = primitives.slot_granted(reply)
        if slot is not None:
            self.counts[slot] = self.counts.get(slot, 0) + 1
        best = max(self.counts.values(), default=0)
        if best >= self.quorum or best + self.left < self.quorum:
            self.decided = True
        return self.decided

    def __ne__(self, reply: object) -> bool:
        return not self.__eq__(reply)

    __hash__ = None  # type: ignore[assignment]


class Slots(Shape):
    """A semaphore of ``limit`` slots: a lease holds one slot, a Redlock mutex of its own
    (``scripts/semaphore_acquire.lua`` says why a per-node counter would not be safe)."""

    kind = "semaphore"
    reentrant = False
    handoff = False
    release_identified = False  # its release script takes no identity
    __slots__ = ("limit", "place", "prefer", "size", "slot")

    def __init__(self, key: str, limit: int, size: int) -> None:
        super().__init__(key)
        self.limit = primitives.check_limit(limit)
        self.size = size
        self.wake_key = primitives.semaphore_base(key)
        self.slot = None  # the slot held, once a quorum granted one
        self.prefer = -1  # between tries: the slot most nodes answered
        # A blocking acquire's place in line (waiter id, ticket, lifetime in ms), for the
        # clean-up of its failed rounds (retry_clean_up); None for a single try.
        self.place: tuple[str, int, int] | None = None

    def acquire(
        self,
        token: str,
        ttl: float,
        owner: str,
        quarantine_ms: int,
        waiter: str,
        ticket: int,
        lifetime_ms: int,
        hand_round: int = 0,
    ) -> Command:
        if waiter:
            self.place = (waiter, ticket, lifetime_ms)
        return primitives.semaphore_acquire_command(
            self.key,
            self.limit,
            token,
            math.ceil(ttl * 1000),
            owner,
            quarantine_ms,
            waiter,
            ticket,
            lifetime_ms,
            self.prefer,
        )

    def decider(self, quorum: int) -> object:
        return SlotDecider(self.size, quorum)

    def granted_on(self, results: Sequence[Any]) -> tuple[bool, ...]:
        return tuple(
            primitives.slot_granted(reply) == self.slot or not heard(reply) for reply in results
        )

    def need(self, quorum: int) -> int:
        return 1  # the decider says yes once, when the round is decided

    def votes(self, results: Sequence[Any], yes: int) -> int:
        counts: dict[int, int] = {}
        for reply in results:
            slot = primitives.slot_granted(reply)
            if slot is not None:
                counts[slot] = counts.get(slot, 0) + 1
        if not counts:
            return 0
        # The slot most nodes granted (the lowest on a tie: every client picks the same).
        slot = min(counts, key=lambda s: (-counts[s], s))
        self.slot = self.prefer = slot
        return counts[slot]

    def refused_ms(self, reply: object) -> int | None:
        if isinstance(reply, list) and len(reply) == 2 and reply[0] == 0:
            ms = reply[1]
            return ms if isinstance(ms, int) else 0
        return None

    def won(self, token: str, results: Sequence[Any]) -> list[Command | None] | None:
        # Nodes whose states differed granted another slot: free it there (the release
        # frees whichever slot the token holds on a node, at most one).
        strays = [primitives.slot_granted(reply) not in (None, self.slot) for reply in results]
        if not any(strays):
            return None
        command = self.release(token, "")
        return [command if stray else None for stray in strays]

    def retry_clean_up(self, token: str, results: Sequence[Any], size: int) -> list[Command | None]:
        # Free what the try took, keeping the waiter's place where a grant dropped it
        # (scripts/semaphore_release.lua says why): the line keeps one order on every node.
        if self.place is None:
            return self.clean_up(token, results, size)
        waiter, ticket, lifetime_ms = self.place
        command = primitives.semaphore_yield_command(
            self.key, self.limit, token, waiter, ticket, lifetime_ms
        )
        return self._where_tried(command, results)

    def release(self, token: str, waiter: str) -> Command:
        return primitives.semaphore_release_command(self.key, self.limit, token, waiter)

    def extend(self, token: str, ttl: float, owner: str) -> Command:
        return primitives.semaphore_extend_command(
            self.key, self._held(), token, math.ceil(ttl * 1000), owner
        )

    def owns(self, token: str) -> Command:
        return primitives.semaphore_owns_command(self.key, self._held(), token)

    def _held(self) -> int:
        if self.slot is None:  # a lease is made only once a quorum granted a slot
            raise RuntimeError("no slot was granted to this semaphore lease")
        return self.slot

    def leave(self, waiter: str, token: str = "", gone: bool = False) -> Command | None:
        return primitives.semaphore_leave_command(self.key, self.limit, waiter)


class ReadWrite(Shape):
    """A read (``kind`` "r") or write ("w") lease of a read-write lock
    (``scripts/rw_acquire.lua``): many readers or one writer. The writer is the lock's own
    hash, so a write lease and a lock of the same name exclude each other."""

    reentrant = False
    handoff = False
    release_identified = False  # its release script takes no identity
    __slots__ = ("kind", "rw")

    def __init__(self, key: str, mode: primitives.Mode) -> None:
        super().__init__(key)
        self.rw = primitives.check_mode(mode)
        self.kind = "read" if self.rw == "r" else "write"

    def acquire(
        self,
        token: str,
        ttl: float,
        owner: str,
        quarantine_ms: int,
        waiter: str,
        ticket: int,
        lifetime_ms: int,
        hand_round: int = 0,
    ) -> Command:
        return primitives.rw_acquire_command(
            self.key,
            self.rw,
            token,
            math.ceil(ttl * 1000),
            owner,
            quarantine_ms,
            waiter,
            ticket,
            lifetime_ms,
        )

    def release(self, token: str, waiter: str) -> Command:
        return primitives.rw_release_command(self.key, self.rw, token, waiter)

    def extend(self, token: str, ttl: float, owner: str) -> Command:
        return primitives.rw_extend_command(self.key, self.rw, token, math.ceil(ttl * 1000), owner)

    def owns(self, token: str) -> Command:
        return primitives.rw_owns_command(self.key, self.rw, token)

    def leave(self, waiter: str, token: str = "", gone: bool = False) -> Command | None:
        return primitives.rw_leave_command(self.key, self.rw, waiter)


class Many(Shape):
    """Several locks as one lease, all or nothing (``scripts/acquire_many.lua``): the very
    keys of single locks of the same names. Deadlock-free: a try takes every key or none on
    a node, and a failed try is released before the next; so it never queues (it polls)."""

    kind = "many"
    reentrant = False
    handoff = False
    release_identified = False  # its release script takes no identity
    __slots__ = ("keys", "release_yes")

    def __init__(self, keys: Sequence[str]) -> None:
        self.keys = primitives.many_keys(keys)
        super().__init__(self.keys[0])
        self.wake_key = None
        self.release_yes = len(self.keys)

    def acquire(
        self,
        token: str,
        ttl: float,
        owner: str,
        quarantine_ms: int,
        waiter: str,
        ticket: int,
        lifetime_ms: int,
        hand_round: int = 0,
    ) -> Command:
        return primitives.acquire_many_command(
            self.keys, token, math.ceil(ttl * 1000), owner, quarantine_ms
        )

    def release(self, token: str, waiter: str) -> Command:
        return primitives.release_many_command(self.keys, token)

    def extend(self, token: str, ttl: float, owner: str) -> Command:
        return primitives.extend_many_command(self.keys, token, math.ceil(ttl * 1000), owner)

    def owns(self, token: str) -> Command:
        return primitives.owns_many_command(self.keys, token)

    def leave(self, waiter: str, token: str = "", gone: bool = False) -> Command | None:
        return None
