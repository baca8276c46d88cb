"""What a procedure yields, and what its driver sends back for each.

=================  =====================================================================
effect             the driver ...                                  and sends back
=================  =====================================================================
:class:`Round`     sends one command per node, waits as the        the round
                   transports' ``run`` does                         (``.results``, ``.yes``)
:class:`Post`      writes the commands, waits for nothing          None
:class:`Sleep`     sleeps ``delay`` seconds                        None
:class:`Listen`    registers a waiter with its subscriber          the waiter id
:class:`Subscribe` subscribes the waiter to a wake key's channel   whether it had to
:class:`Wait`      waits for a wake-up or hand-off grants          whether one came
:class:`Grants`    reads the hand-off grants heard for the waiter  node index -> round
=================  =====================================================================

Every wait is bounded by the driver's node timeout where the transports bound it (a round, a
subscription); the driver unregisters the waiter it registered once the procedure ends.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from inspect import GEN_SUSPENDED, getgeneratorstate
from typing import Any, Protocol

from django_redlock.wire.scripts import Command

__all__ = [
    "LISTEN",
    "Answer",
    "Effect",
    "Grants",
    "Listen",
    "Post",
    "Round",
    "Sleep",
    "Subscribe",
    "Wait",
    "unwind",
]


class Round:
    """Send ``commands`` (one per node; None: nothing to that node) and wait until ``need``
    replies equal ``yes`` (the ``yes_value`` of the transports' ``run``), ``give_up`` cannot
    (None: the transports' default), or the node timeout. ``identify``: tell the node's
    server process with each reply. ``queue_behind``: a release: never skip a node that
    still owes replies, and carry the round (and the procedure after it) to its end even if
    the caller is cancelled."""

    __slots__ = ("commands", "give_up", "identify", "need", "queue_behind", "yes")

    def __init__(
        self,
        commands: Sequence[Command | None],
        yes: object,
        need: int,
        give_up: int | None = None,
        identify: bool = False,
        queue_behind: bool = False,
    ) -> None:
        self.commands = commands
        self.yes = yes
        self.need = need
        self.give_up = give_up
        self.identify = identify
        self.queue_behind = queue_behind


class Post:
    """Write ``commands`` (one per node, None: none) behind what each connection already
    carries, and wait for nothing: a clean-up, which must go out even while the procedure
    unwinds on an interrupt or a cancellation."""

    __slots__ = ("commands",)

    def __init__(self, commands: Sequence[Command | None]) -> None:
        self.commands = commands


class Sleep:
    """Sleep ``delay`` seconds (the driver's sleep: a test's fake clock's, or the real one)."""

    __slots__ = ("delay",)

    def __init__(self, delay: float) -> None:
        self.delay = delay


class Listen:
    """Register a new waiter (a place in line hears its wake-ups by this id) and send its id
    back. Registered before the first try, so a release naming it is kept even if it comes
    before the waiter waits."""

    __slots__ = ()


LISTEN = Listen()


class Subscribe:
    """Subscribe ``waiter`` to the release channel of the wake key ``key``; send back True
    when the subscriber had to subscribe (the nodes confirmed just now), False when the
    channel was heard all along."""

    __slots__ = ("key", "waiter")

    def __init__(self, key: str, waiter: str) -> None:
        self.key = key
        self.waiter = waiter


class Wait:
    """Wait up to ``delay`` seconds for the release that wakes ``waiter`` or, with ``need``,
    until that many nodes granted it the lock (the rest settle within a node timeout); send
    back whether a wake-up or grants came."""

    __slots__ = ("delay", "need", "waiter")

    def __init__(self, waiter: str, delay: float, need: int) -> None:
        self.waiter = waiter
        self.delay = delay
        self.need = need


class Grants:
    """Send back the hand-off grants heard for ``waiter`` (node index -> the round each
    names), taking them."""

    __slots__ = ("waiter",)

    def __init__(self, waiter: str) -> None:
        self.waiter = waiter


Effect = Round | Post | Sleep | Listen | Subscribe | Wait | Grants
"""What a procedure yields."""


class Answer(Protocol):
    """What a driver sends back for a :class:`Round` (the transports' round): each node's
    reply, in node order, and how many equal its ``yes``."""

    @property
    def results(self) -> Sequence[Any]: ...

    @property
    def yes(self) -> int: ...


def unwind(
    procedure: Generator[Effect, Any, Any],
    error: BaseException,
    post: Callable[[Sequence[Command | None]], object],
) -> None:
    """Throw ``error`` into ``procedure`` if it is left suspended at a ``yield``, and carry out
    the posts it yields while it unwinds (its clean-ups), with ``post``. For an error raised
    in a driver's own frame between two effects, where no effect was running to throw it into:
    a signal handler's ``KeyboardInterrupt`` (or a Celery soft time limit) at the driver
    loop's back edge, the instant a won round's SETs are on the nodes. Left suspended, the
    procedure would be closed by the garbage collector, where it can post nothing: its keys
    stayed on the nodes for a whole ttl, and its place in line until it lapsed (found by
    review, with an interrupt injected at each line of the sync driver).

    Never raises: ``error`` (or whatever the procedure raised in its place) is the caller's
    to raise. An effect other than a post (a procedure never yields one while unwinding)
    gets ``error`` thrown in again.
    """
    if getgeneratorstate(procedure) != GEN_SUSPENDED:
        return  # ended (the usual case: the error came out of it), or never started
    try:
        effect = procedure.throw(error)
        while True:
            if type(effect) is Post:
                post(effect.commands)
                effect = procedure.send(None)
            else:
                effect = procedure.throw(error)
    except BaseException:  # the procedure ended, as it had to
        return
