"""The Redlock steps as plain functions over replies: no I/O, no clock, no logging.

Both managers (:class:`~django_redlock.redlock.LockManager` and
:class:`~django_redlock.aredlock.AsyncLockManager`) run the same steps; each only moves the
commands built here to the nodes, hands the replies back, and sleeps when told. The steps
follow the Redis "Distributed Locks with Redis" page (the Redlock section):

1. take the time on a monotonic clock (the caller passes it in);
2. send the same SET-if-absent to all N nodes at once (:meth:`Acquire.next_round`);
3. the lock is held when a quorum ``N // 2 + 1`` granted it and the validity
   ``ttl - elapsed - (ttl * drift_factor + 2 ms)`` is still positive (:func:`validity`);
4. otherwise unlock every node the SET may have reached and retry after a random delay, or
   give up (:meth:`Acquire.judge`).

After a failed round the flow also says what to do next, as an action (:class:`GiveUp`,
:class:`Sleep`, :class:`Subscribe`, :class:`Wait`; before the first acquire,
:class:`Contact`): each manager's loop only carries it out, with ``time.sleep`` and the
sync subscriber or with ``await``, and reports back (:meth:`Acquire.waited`,
:meth:`Acquire.subscribed`), so the two loops cannot drift apart.

Replies per node are what both transports report: the reply itself, ``None`` (no command
sent), a :class:`~django_redlock.wire.errors.NodeError` (``NotSent`` when it never left),
:data:`~django_redlock.wire.errors.TIMED_OUT` or ``PENDING`` (not waited for).
"""

from __future__ import annotations

import json
import math
import random
import re
import secrets
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from django_redlock.exceptions import LockContended, LockNotAcquired, QuorumUnreachable
from django_redlock.procedures.arguments import DRIFT_SECONDS
from django_redlock.procedures.shapes import Shape, heard, lock_refusal
from django_redlock.wire.errors import PENDING, TIMED_OUT, NodeError, NotSent
from django_redlock.wire.primitives import handback_command, handoff_command
from django_redlock.wire.scripts import (
    FORCE_RELEASE,
    GRANTED,
    HOLDER,
    LAPSE,
    LINE,
    Command,
    hand_undo_command,
    hand_yield_command,
)

__all__ = [
    "DRIFT_SECONDS",
    "EXPIRED",
    "GONE",
    "NEVER_YES",
    "TAKEN",
    "Acquire",
    "Action",
    "Contact",
    "ExtendTally",
    "Failed",
    "FirstTry",
    "GiveUp",
    "Granted",
    "Lost",
    "Missed",
    "Nodes",
    "ReleaseVerdict",
    "Sleep",
    "Subscribe",
    "Wait",
    "error_text",
    "extend_round",
    "extend_tally",
    "failure",
    "force_release_round",
    "handoff_round",
    "has_node_errors",
    "holder_of",
    "holder_round",
    "is_locked",
    "judge_adopt",
    "judge_extend",
    "judge_release",
    "leave_round",
    "lost_clean_up",
    "node_errors",
    "owned",
    "owns_round",
    "quarantine_left",
    "release_round",
    "retry_delay",
    "summarise",
    "takes_grants",
    "validity",
    "won",
]


@dataclass(frozen=True)
class Nodes:
    """What the steps need to know of a manager's nodes: their labels (URLs without
    passwords, in order), the quorum, and the timing rules (seconds)."""

    labels: tuple[str, ...]
    quorum: int
    node_timeout: float
    drift_factor: float
    retry_delay: float
    acked: bool = False
    """Whether a node has REPLICA_ACKS (wire/acks.py): then no hand-off grants are taken (a
    grant a release makes is followed by no WAIT; the waiter's own try is)."""

    size: int = field(init=False)
    """How many nodes (``len(labels)``; a field, as it is read several times a round)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", len(self.labels))


def validity(ttl: float, elapsed: float, drift_factor: float) -> float:
    """Seconds a lease of ``ttl`` seconds is good for after a round of ``elapsed`` seconds:
    ``ttl - elapsed - (ttl * drift_factor + 2 ms)`` (the Redlock spec's step 3)."""
    return ttl - elapsed - (ttl * drift_factor + DRIFT_SECONDS)


def won(nodes: Nodes, ttl: float, votes: int, elapsed: float) -> float:
    """The Redlock spec's step 3, the one rule every acquire round is judged by: the validity
    in seconds of a lease of ``ttl`` seconds whose round had ``votes`` yes votes and took
    ``elapsed`` seconds, when the round won it (a quorum, and some validity left); else 0.0.
    Used by :meth:`Acquire.judge` and by the managers' first try (:class:`FirstTry`)."""
    left = validity(ttl, elapsed, nodes.drift_factor)
    return left if votes >= nodes.quorum and left > 0 else 0.0


def takes_grants(waiter: str, shape: Shape) -> bool:
    """Whether an acquire of ``shape`` with place in line ``waiter`` takes hand-off grants
    (see :attr:`Acquire.hand`): a blocking acquire of a plain lock."""
    return bool(waiter) and shape.kind == "lock"


def retry_delay(
    base: float,
    now: float,
    deadline: float | None,
    polls: int = 0,
    uniform: Callable[[float, float], float] = random.uniform,
) -> float:
    """Seconds until the next try: ``base`` ± 50 % jitter, never past ``deadline``.

    ``polls``: how many waits in a row ended with no wake-up. A waiter is woken by the
    release that makes it the head of the line (pub/sub); its poll only covers a wake-up
    lost to a node failure, so the poll backs off, doubling each time up to a fifth of the
    life of a place in line (``max(1 s, 4 * base)``; never below ``base``): even with the
    jitter and a slow try, the place is kept. Without it, hundreds of waiters polling at a
    short ``base`` saturate the nodes, and every hand-off waits behind their retries.
    """
    if polls:
        cap = max(base, max(1.0, 4 * base) / 5)
        base = min(base * 2.0 ** min(polls, 20), cap)
    delay = base * uniform(0.5, 1.5)
    return delay if deadline is None else min(delay, deadline - now)


# -- the commands of a round: one per node ------------------------------------------------


def release_round(size: int, shape: Shape, token: str, waiter: str = "") -> list[Command]:
    """Compare-and-delete on every node (``scripts/release.lua`` for a lock); ``waiter``
    drops the holder's place in line where it remains."""
    return [shape.release(token, waiter)] * size


def extend_round(size: int, shape: Shape, token: str, ttl: float, owner: str) -> list[Command]:
    """Renew to ``ttl`` seconds where the lease holds ``token``, re-creating it where a node
    lost it (``scripts/extend.lua`` for a lock; ``owner`` is stored then)."""
    return [shape.extend(token, ttl, owner)] * size


def owns_round(size: int, shape: Shape, token: str) -> list[Command]:
    return [shape.owns(token)] * size


def leave_round(
    size: int, shape: Shape, waiter: str, token: str = "", gone: Collection[int] = ()
) -> list[Command] | None:
    """Leave the wait line on every node (``scripts/leave.lua`` for a lock); None for a
    shape that never queues. ``token``: a waiter's hand-off token, freed where it is held;
    ``gone``: the indexes of the nodes where a try of the waiter may not have run yet, which
    keep a mark that refuses it (see :meth:`Acquire.left_line`)."""
    command = shape.leave(waiter, token)
    if command is None:
        return None
    if not gone:
        return [command] * size
    marking = shape.leave(waiter, token, gone=True)
    assert marking is not None
    return [marking if index in gone else command for index in range(size)]


def holder_round(size: int, key: str) -> list[Command]:
    return [HOLDER.command((key,), ())] * size


def force_release_round(size: int, key: str) -> list[Command]:
    return [FORCE_RELEASE.command((key, key + LINE, key + LAPSE), ())] * size


# -- judging rounds -----------------------------------------------------------------------


@dataclass(frozen=True)
class Granted:
    """An acquire round won: the lease's token and, on the caller's clock, when it was
    taken and when its validity runs out."""

    token: str
    acquired_at: float
    expires_at: float


@dataclass(frozen=True)
class Failed:
    """An acquire round lost. ``clean_up``: the releases to send now (see
    :meth:`Shape.clean_up`). ``give_up``: raise ``error`` (the managers then send
    :meth:`Acquire.left_line`, as on any exit that is not a grant); else wait ``delay``
    seconds (or until woken) and try again. ``waited``: seconds since the acquire began."""

    error: LockNotAcquired
    clean_up: list[Command | None]
    give_up: bool
    delay: float
    waited: float


# -- what a manager does next: actions (its loop only carries them out) -------------------


class Contact:
    """Hear from the nodes before a manager's first acquire (or adopt): send ``commands``
    (a PING per node) and wait, at most the node timeout, until ``need`` (a quorum) answered
    ``PONG``. Each new connection first learns its node's server and the longest restart
    quarantine it has seen (``wire.sync.Hello``), which must be known before an acquire
    reaches a node that restarted (``scripts/node_rule.lua``).

    Carried out *before* the acquire begins (:class:`Acquire` ``started``), by both
    managers: it never counts against the acquire's ``timeout``."""

    __slots__ = ("commands", "need")

    def __init__(self, commands: list[Command], need: int) -> None:
        self.commands = commands
        self.need = need


class GiveUp:
    """Stop trying: raise ``error`` (reported already; the manager leaves the line, as on
    any exit that is not a grant)."""

    __slots__ = ("error",)

    def __init__(self, error: LockNotAcquired) -> None:
        self.error = error


class Sleep:
    """Poll: sleep ``delay`` seconds, then call :meth:`Acquire.waited` with False, and try
    again. For a try that never queues (nothing wakes it), a shape without a line, and a
    manager given a ``sleep`` function (a test's fake clock), which hears no releases."""

    __slots__ = ("delay",)

    def __init__(self, delay: float) -> None:
        self.delay = delay


class Subscribe:
    """Subscribe to the release channel of the wake key ``key`` (the manager's subscriber,
    bounded by the node timeout), then tell :meth:`Acquire.subscribed` whether it had to
    subscribe; it says whether to try at once or :class:`Wait` ``delay`` seconds."""

    __slots__ = ("delay", "key")

    def __init__(self, key: str, delay: float) -> None:
        self.key = key
        self.delay = delay


class Wait:
    """Wait up to ``delay`` seconds for the release that wakes this waiter (pub/sub), then
    call :meth:`Acquire.waited` with whether it came, and try again.

    ``need``: for a waiter that takes hand-off grants (:attr:`Acquire.hand`), the wait also
    ends once that many nodes granted it the lock (``scripts/hand_grant.lua``); the manager
    then gives the grants heard to :meth:`Acquire.hear_grants`, which may hold the lease without
    another round. 0: only a wake-up ends the wait."""

    __slots__ = ("delay", "need")

    def __init__(self, delay: float, need: int = 0) -> None:
        self.delay = delay
        self.need = need


Action = GiveUp | Sleep | Subscribe | Wait
"""What to do after a failed round (:meth:`Acquire.after`)."""


class FirstTry:
    """The first round of an acquire, built and judged without an :class:`Acquire` (the
    managers' fast path: most acquires are won by their first round). The round is the one
    :meth:`Acquire.next_round` would build first, judged by the same rule (:func:`won`);
    when it does not win, the managers continue with :meth:`Acquire.after_first`, which
    judges that very round again (and so cleans up, reports and waits) as if it had built
    it. Times in seconds on the manager's clock; ``started`` when the acquire began.

    Also what :meth:`~django_redlock.core.engine.Engine.grant` reads of a won acquire: the
    attributes it shares with :class:`Acquire` (name, key, ttl, owner, waiter, started,
    shape, votes, :meth:`interrupted`).
    """

    __slots__ = (
        "blocking",
        "commands",
        "decider",
        "key",
        "lifetime_ms",
        "name",
        "need",
        "nodes",
        "owner",
        "shape",
        "started",
        "ticket",
        "token",
        "ttl",
        "votes",
        "waiter",
    )

    def __init__(
        self,
        nodes: Nodes,
        name: str,
        key: str,
        shape: Shape,
        ttl: float,
        owner: str,
        blocking: bool,
        started: float,
        waiter: str,
        ticket: int,
        lifetime_ms: int,
        quarantine_ms: int,
    ) -> None:
        self.nodes = nodes
        self.name = name
        self.key = key  # the lease's (several locks: not the shape's first key)
        self.shape = shape
        self.ttl = ttl
        self.owner = owner
        self.blocking = blocking
        self.started = started
        self.waiter = waiter
        self.ticket = ticket
        self.lifetime_ms = lifetime_ms
        self.votes = 0
        quorum = nodes.quorum
        self.decider = shape.decider(quorum)
        self.need = shape.need(quorum)
        # Acquire.next_round's first round: a fresh token (a hand-off waiter keeps it for
        # every later round), round number 1 for a waiter taking grants.
        self.token = token = secrets.token_hex(20)
        command = shape.acquire(
            token,
            ttl,
            owner,
            quarantine_ms,
            waiter,
            ticket,
            lifetime_ms,
            1 if waiter and takes_grants(waiter, shape) and not nodes.acked else 0,
        )
        self.commands = [command] * nodes.size

    def judge(self, results: Sequence[Any], yes: int, start: float, end: float) -> float:
        """The validity in seconds the round, sent at ``start`` and with ``yes`` yes votes
        known at ``end``, won (:func:`won`); 0.0 when it did not win (then continue with
        :meth:`Acquire.after_first`)."""
        votes = self.votes = self.shape.votes(results, yes)
        return won(self.nodes, self.ttl, votes, end - start)

    def interrupted(self) -> list[Command | None]:
        """As :meth:`Acquire.interrupted`: the releases of what the round may have set."""
        return self.shape.clean_up(self.token, None, self.nodes.size)


@dataclass
class Acquire:
    """One acquire of lock ``name``, from its first round to its outcome.

    Times are on the caller's monotonic clock, in seconds: ``started`` when the acquire
    began, ``deadline`` when it stops trying (None: never). ``waiter`` is the id of a
    blocking acquire's place in line ("" for a single try, which never queues), ``ticket``
    its place (the same number on every node) and ``lifetime_ms`` how long a place lasts
    without a new try.

    ``shape``: what the lease is on the nodes (default: a lock on ``key``). ``listens``:
    whether the manager can hear releases (False when it was given a ``sleep`` function:
    then every wait is a poll).
    """

    nodes: Nodes
    name: str
    key: str
    ttl: float
    owner: str
    blocking: bool
    started: float
    deadline: float | None
    waiter: str = ""
    ticket: int = 0
    lifetime_ms: int = 0
    uniform: Callable[[float, float], float] = random.uniform
    attempts: int = 0
    polls: int = 0  # waits that ended without a wake-up (see retry_delay)
    token: str = field(default="", repr=False)
    shape: Shape | None = None
    decider: object = field(default=None, repr=False)
    votes: int = 0  # the yes votes of the last round judged
    listens: bool = True
    listening: bool = False  # subscribed to the wake channel (see after)
    hand: bool = field(default=False, init=False)
    """A blocking acquire of a plain lock: it takes hand-off grants. Its token is its hand-off
    token for every round (``scripts/hand_register.lua``); what its failed rounds took is
    kept or yielded to an older waiter, not released (see :meth:`_hand_clean_up`)."""
    rounds: dict[int, float] = field(default_factory=dict, init=False, repr=False)
    """Round number -> its send time (the ``start`` given to :meth:`judge`)."""
    held_since: dict[int, float] = field(default_factory=dict, init=False, repr=False)
    """Node index -> the earliest instant its key of this waiter's token may date from (a
    grant or a try that answered granted), for nodes that may hold it now."""
    unanswered: set[int] = field(default_factory=set, init=False, repr=False)
    """Node indexes where a try of this waiter taking grants may not have run yet (its reply
    was not heard: not waited for, timed out, or an I/O error). Its leave marks it gone there
    (``scripts/hand_gone.lua``): a try a node runs after the leave would queue a phantom at
    the head of the line, granted the lock for its whole ttl by the next release."""
    answered: dict[int, float] = field(default_factory=dict, init=False, repr=False)
    """Node index -> the last round whose reply from that node was heard (plus a half when
    that reply said it holds the token and a yield followed: its grants count no more)."""
    last_results: Sequence[Any] = field(default=(), init=False, repr=False)
    outage: int = field(default=0, init=False, repr=False)
    """Rounds in a row in which so many nodes refused the connection outright that no quorum
    was possible (see :func:`plainly_refusing`)."""

    def __post_init__(self) -> None:
        if self.shape is None:
            self.shape = Shape(self.key)
        self.hand = takes_grants(self.waiter, self.shape) and not self.nodes.acked

    @classmethod
    def after_first(
        cls,
        first: FirstTry,
        deadline: float | None,
        listens: bool,
        uniform: Callable[[float, float], float] = random.uniform,
    ) -> Acquire:
        """The flow of the acquire whose first round ``first`` was (sent, not judged yet):
        as if :meth:`next_round` had built that round. Its :meth:`judge` of that round comes
        next, or, when the round was interrupted, :meth:`interrupted` and :meth:`left_line`.
        ``uniform``: the retry jitter (a test's seeded one)."""
        return cls(
            first.nodes,
            first.name,
            first.key,
            first.ttl,
            first.owner,
            first.blocking,
            first.started,
            deadline,
            first.waiter,
            first.ticket,
            first.lifetime_ms,
            uniform=uniform,
            attempts=1,
            token=first.token,
            shape=first.shape,
            decider=first.decider,
            listens=listens,
        )

    @property
    def known_shape(self) -> Shape:
        """The shape of this acquire (set in ``__post_init__``, so never None here)."""
        assert self.shape is not None
        return self.shape

    @property
    def need(self) -> int:
        """How many yes votes decide a round (the ``need`` of the transports' ``run``)."""
        shape = self.shape
        assert shape is not None
        return shape.need(self.nodes.quorum)

    def next_round(self, quarantine_ms: int) -> list[Command]:
        """The commands of the next attempt, with a fresh token: the clean-up release of a
        failed attempt may reach a node late (pipelined, or re-sent after NOSCRIPT) and must
        never hit a later attempt's key."""
        self.attempts += 1
        shape = self.shape  # not self.known_shape: one call less per round
        assert shape is not None
        # The yes_value of this round: a reply equal to it is a yes vote (see Shape.decider).
        self.decider = shape.decider(self.nodes.quorum)
        if not (self.hand and self.token):
            # A hand-off waiter keeps one token for every round: the hand-off token a release
            # may grant (see `hand`). A late clean-up cannot undo what a later round found:
            # none deletes a key a reply said is there, and the one that follows a lost reply
            # deletes nothing once a later try ran on that node (see _hand_clean_up).
            self.token = secrets.token_hex(20)
        command = shape.acquire(
            self.token,
            self.ttl,
            self.owner,
            quarantine_ms,
            self.waiter,
            self.ticket,
            self.lifetime_ms,
            self.attempts if self.hand else 0,
        )
        return [command] * self.nodes.size

    def judge(
        self, results: Sequence[Any], granted: int, start: float, end: float
    ) -> Granted | Failed:
        """The outcome of the round sent at ``start`` whose ``granted`` yes votes were known
        at ``end``: a lease, or what to do next."""
        nodes = self.nodes
        shape = self.shape  # not self.known_shape: one call less per round
        assert shape is not None
        granted = self.votes = shape.votes(results, granted)
        left = won(nodes, self.ttl, granted, end - start)
        if left:
            # The keys were set no earlier than `start`, so they live (on the nodes' clocks,
            # less drift) until start + ttl - drift: the instant validity reaches 0.
            return Granted(self.token, acquired_at=end, expires_at=end + left)
        if self.hand:
            self._note_round(results, start)  # only a waiter that goes on needs it
        error = failure(
            nodes, self.name, results, granted, end - start, self.attempts, shape.refused_ms
        )
        give_up = not self.blocking or (self.deadline is not None and end >= self.deadline)
        pause = None
        if give_up or self.deadline is None:
            pass
        elif (refusing := plainly_refusing(results)) and nodes.size - refusing - (
            late := quarantined_past(results, self.deadline - end)
        ) < nodes.quorum:
            # A total outage: the nodes refuse connections outright (nothing listens there,
            # or the name does not resolve), or the rest are quarantined past the deadline,
            # so no quorum is possible, and retrying every retry_delay until the timeout
            # would only stall the caller (a web worker) for nothing. One more round after
            # one node timeout (a restart may be under way), then give up, saying so. A
            # caller who asked to wait (timeout=None) keeps waiting; one node of three down
            # changes nothing here. (Nodes quarantined alone: the quarantine rule below.)
            self.outage += 1
            if self.outage >= 2:
                give_up = True
                error = outage_error(error, nodes, late)
            else:
                # Never past the deadline (the same bound as retry_delay's).
                pause = min(nodes.node_timeout, self.deadline - end)
        else:
            self.outage = 0
        if self.hand:
            clean_up = self._hand_clean_up(results, give_up)
        elif give_up:
            clean_up = shape.clean_up(self.token, results, nodes.size)
        else:
            clean_up = shape.retry_clean_up(self.token, results, nodes.size)
        if give_up:
            return Failed(error, clean_up, True, 0.0, end - self.started)
        if pause is not None:
            return Failed(error, clean_up, False, pause, end - self.started)
        quarantined = error.quarantined
        if quarantined is not None:
            # The nodes said when a quorum votes again: never wait out a timeout that the
            # quarantine is known to outlast, and do not poll them before it ends.
            if self.deadline is not None and end + quarantined > self.deadline:
                return Failed(error, clean_up, True, 0.0, end - self.started)
            return Failed(error, clean_up, False, quarantined, end - self.started)
        delay = retry_delay(nodes.retry_delay, end, self.deadline, self.polls, self.uniform)
        return Failed(error, clean_up, False, delay, end - self.started)

    def after(self, step: Failed) -> Action:
        """What to do after the failed round ``step`` (see :meth:`judge`): give up, poll,
        subscribe to the releases, or wait for one. Every wait ends in :meth:`waited`."""
        if step.give_up:
            return GiveUp(step.error)
        if self.outage:
            # The nodes refused connections: the one node timeout before the last round is a
            # plain sleep (subscribing would try again at once, and there is nobody to hear).
            return Sleep(step.delay)
        wake_key = self.known_shape.wake_key
        if not self.listens or not self.waiter or wake_key is None:
            return Sleep(step.delay)
        if not self.listening:
            self.listening = True
            return Subscribe(wake_key, step.delay)
        # Listening since before the last try (the channel was kept from an earlier wait,
        # of this manager's thread or task or another): any release since then was
        # published, and kept for this waiter.
        return Wait(step.delay, self.nodes.quorum if self.hand else 0)

    def subscribed(self, fresh: bool, delay: float) -> Wait | None:
        """A :class:`Subscribe` was carried out: ``fresh`` when the subscriber had to
        subscribe (the nodes confirmed just now). Then try at once (None): the try right
        after subscribing covers a release that came between the last try and the
        subscription. Otherwise the channel was heard all along: :class:`Wait` ``delay``."""
        return None if fresh else Wait(delay, self.nodes.quorum if self.hand else 0)

    def _hand_clean_up(self, results: Sequence[Any], give_up: bool) -> list[Command | None]:
        """The clean-up of a failed round of a waiter taking grants (see :attr:`hand`).

        Where a reply said the node holds its token (granted, or taken by the try as the
        head of the line): yielded to an older waiter in line there, if any, else kept
        (``scripts/hand_yield.lua``: the nodes may disagree on the head, and two waiters
        each keeping a minority would wait out their keys). Such a node no longer counts
        until a later reply. When it gives up, left_line frees its token everywhere.

        Where the reply was not heard (a node that failed or timed out, or one not waited
        for), the try may still land late (a stalled node runs its queued input when it
        wakes, maybe after this waiter left, its leave sent on a newer connection, or lost
        with a connection dropped while the node stalled): what it took is deleted right
        behind it, on the same connection, as any failed try's SET, unless a later try of
        this waiter ran there first or the key is a grant (``scripts/hand_undo.lua``). So
        nothing the waiter may count is deleted: it counts grants, and keys its tries took
        only from replies it heard.
        """
        shape = self.known_shape
        release = hand_undo_command(shape.key, self.token, self.waiter, self.attempts)
        settle = hand_yield_command(
            shape.key, self.token, self.waiter, self.ticket, self.lifetime_ms, self.attempts
        )
        after = self.attempts + 0.5
        clean_up: list[Command | None] = []
        for index, reply in enumerate(results):
            if reply == GRANTED:
                self.held_since.pop(index, None)
                self.answered[index] = after
                clean_up.append(None if give_up else settle)
            elif reply is PENDING or not heard(reply):
                clean_up.append(release)
            else:
                clean_up.append(None)
        return clean_up

    def _note_round(self, results: Sequence[Any], start: float) -> None:
        """Remember what round ``self.attempts``, sent at ``start``, said of each node (a
        waiter taking grants): a grant heard later for this round dates from ``start``."""
        round_ = self.attempts
        self.rounds[round_] = start
        self.last_results = results
        for index, reply in enumerate(results):
            if isinstance(reply, NotSent):
                continue  # never left: what was known stays
            if not heard(reply):
                # Not waited for, failed or timed out: what the try did is not known here;
                # its clean-up (see _hand_clean_up) never deletes a grant. It may still run
                # after this waiter's leave (see unanswered).
                self.unanswered.add(index)
                continue
            self.answered[index] = round_
            if reply == GRANTED:
                self.held_since[index] = start
            else:
                # Refused (held by another, others ahead) or an error: nothing of ours here
                # (the vote gate of acquire.lua runs before any write).
                self.held_since.pop(index, None)

    def hear_grants(self, grants: Mapping[int, int], now: float) -> Granted | None:
        """Hand-off grants heard while waiting (node index -> the round each names, see
        ``scripts/hand_grant.lua``): the lease when, with what the rounds said, a quorum of
        nodes holds this waiter's token and some validity is left at ``now``; else None (the
        waiter tries again: its try renews the grants it has and takes free nodes).

        A grant naming round r was made after the node processed round r's try, so no
        earlier than r's send time; a grant naming a round older than the last reply heard
        from that node is stale (that reply said where things stand). The lease's validity
        counts from the quorum-th latest such time among the nodes that hold it: a quorum
        holds the token at least until then plus the ttl, less drift.
        """
        for index, round_ in grants.items():
            sent = self.rounds.get(round_)
            if sent is None or round_ < self.answered.get(index, 0):
                continue
            if sent > self.held_since.get(index, -math.inf):
                self.held_since[index] = sent
        quorum = self.nodes.quorum
        if len(self.held_since) < quorum:
            return None
        since = sorted(self.held_since.values(), reverse=True)[quorum - 1]
        left = validity(self.ttl, now - since, self.nodes.drift_factor)
        if left <= 0:
            return None  # too little left: one more round renews the grants (extend once)
        self.votes = len(self.held_since)
        return Granted(self.token, acquired_at=now, expires_at=now + left)

    def granted_results(self) -> list[Any]:
        """The replies a lease held from grants (:meth:`hear_grants`) reports: granted where this
        waiter's token is known to be, else what the last round said."""
        results = list(self.last_results) or [TIMED_OUT] * self.nodes.size
        for index in self.held_since:
            results[index] = GRANTED
        return results

    def waited(self, woken: bool) -> None:
        """A wait between rounds ended, ``woken`` by a release or not (a poll, which makes
        the next polls less frequent: see :func:`retry_delay`)."""
        if not woken:
            self.polls += 1

    def interrupted(self) -> list[Command | None]:
        """The releases to send when the round in flight is interrupted (cancelled, a signal):
        some SETs may have landed, or may still land on a slow node (and a try of a waiter
        taking grants may run after its leave: see :attr:`unanswered`)."""
        if self.hand:
            self.unanswered.update(range(self.nodes.size))
        return self.known_shape.clean_up(self.token, None, self.nodes.size)

    def left_line(self) -> list[Command] | None:
        """The commands that drop the waiter's place in line (None for a single try), sent
        on every exit that is not a grant. A waiter taking grants leaves with its token, on
        every node: grants (and keys its tries took as the head of the line) may be there
        whether or not a reply said so, and would otherwise hold the lock until they expire
        (``scripts/leave.lua``); where one of its tries went unanswered, the leave also marks
        it gone, refusing that try if it runs later (:attr:`unanswered`)."""
        if not self.waiter:
            return None
        token = self.token if self.hand else ""
        if token:
            self.held_since.clear()
        return leave_round(self.nodes.size, self.known_shape, self.waiter, token, self.unanswered)

    def strays(self, results: Sequence[Any]) -> list[Command | None] | None:
        """After a round won: the releases of grants outside the lease (see
        :meth:`Shape.won`), or None."""
        shape = self.shape
        assert shape is not None
        return shape.won(self.token, results)


def failure(
    nodes: Nodes,
    name: str,
    results: Sequence[Any],
    granted: int,
    elapsed: float,
    attempts: int,
    refused_ms: Callable[[object], int | None] | None = None,
) -> LockNotAcquired:
    """The error of failed attempt number ``attempts``: contended when the nodes that
    answered could still have formed a quorum, else quorum unreachable. Its ``retry_after``
    says when the holder's keys run out on enough nodes for a quorum (if not renewed).
    ``refused_ms``: a node's refusal as ms left (default: an integer reply, a lock's)."""
    read = lock_refusal if refused_ms is None else refused_ms
    held = [ms for ms in map(read, results) if ms is not None]
    # Besides the nodes that granted this attempt, `need` more must free up: the need-th
    # shortest time left among the holders' answers. Keys without expiry (-1) never run out;
    # nodes not heard from are not counted (a lower bound then).
    expiring = sorted(reply for reply in held if reply >= 0)
    need = nodes.quorum - granted
    retry_after = expiring[need - 1] / 1000 if 0 < need <= len(expiring) else None
    errors = node_errors(nodes, results)
    error_class: type[LockNotAcquired] = QuorumUnreachable
    quarantined = None
    reason = ""
    if granted >= nodes.quorum:
        reason = f"the attempt took {elapsed * 1000:.1f} ms: nothing left of the lease"
    elif len(errors) <= nodes.size - nodes.quorum:
        error_class = LockContended
    else:
        quarantined = quarantine_left(nodes.quorum, results)
        if quarantined is not None and retry_after is None:
            retry_after = quarantined
    return error_class(
        name,
        votes=granted,
        quorum=nodes.quorum,
        node_errors=errors,
        retry_after=retry_after,
        attempts=attempts,
        quarantined=quarantined,
        node_answers=node_answers(nodes, results, read),
        reason=reason,
    )


_REFUSALS = (
    "connection refused",
    "no such file or directory",
    "name or service not known",
    "temporary failure in name resolution",
    "nodename nor servname provided",
    "no address associated with hostname",
    "name does not resolve",  # musl's getaddrinfo
    "name not resolved",
    "connect call failed",  # asyncio's words for a refused TCP connect
)
"""What a node's error says when its connection was refused outright (lower case): nothing
listens at the address, or the name does not resolve. Not a timeout, not a reset: those
may be a node that is alive but slow."""


def plainly_refusing(results: Sequence[Any]) -> int:
    """How many nodes of a round refused the connection outright (see :data:`_REFUSALS`)."""
    count = 0
    for reply in results:
        if isinstance(reply, NodeError):
            text = str(reply).lower()
            count += any(refusal in text for refusal in _REFUSALS)
    return count


def quarantined_past(results: Sequence[Any], seconds: float) -> int:
    """How many nodes of a round refused as quarantined for longer than ``seconds`` (they
    said when they vote again, see :func:`quarantine_left`)."""
    return sum(1 for reply in results if (votes_again_in(reply) or 0.0) > seconds)


def outage_error(error: LockNotAcquired, nodes: Nodes, quarantined: int = 0) -> LockNotAcquired:
    """``error`` again, saying that it gave up early because the nodes refuse connections
    (``quarantined`` more nodes of them vote again only after the caller's deadline)."""
    which = "the nodes refuse connections (down, or a wrong address)"
    if quarantined:
        which = (
            "of the nodes, some refuse connections (down, or a wrong address) and "
            f"{quarantined} vote again only after the timeout (quarantined)"
        )
    return QuorumUnreachable(
        error.name,
        votes=error.votes,
        quorum=error.quorum,
        node_errors=error.node_errors,
        retry_after=error.retry_after,
        attempts=error.attempts,
        quarantined=error.quarantined,
        node_answers=error.node_answers,
        reason=(
            f"no quorum is possible: {which}; gave up after {error.attempts} attempts, one "
            f"node timeout ({nodes.node_timeout * 1000:.0f} ms) apart, instead of retrying "
            "until the timeout (timeout=None waits for them)"
        ),
    )


def node_answers(
    nodes: Nodes, results: Sequence[Any], refused_ms: Callable[[object], int | None]
) -> dict[str, str]:
    """Node label -> what it answered to an acquire round, for every node of the round."""
    answers = {}
    for label, reply in zip(nodes.labels, results, strict=True):
        if reply is TIMED_OUT or isinstance(reply, NodeError):
            answers[label] = error_text(reply, nodes.node_timeout)
        elif reply is PENDING:
            answers[label] = "not waited for"
        else:
            left = refused_ms(reply)
            if left is None:
                answers[label] = "granted"
            elif left > 0:
                answers[label] = f"held by another holder, {left / 1000:g} s left"
            elif left == 0:
                answers[label] = "refused: others are ahead in line"
            else:
                answers[label] = "held by another holder, no expiry"
    return answers


_LONGER = re.compile(r"^QUARANTINE_LONGER (\d+) ms")


def longer_quarantines(node_errors: Mapping[str, str]) -> dict[str, int]:
    """Node label -> the quarantine in ms a node refused a vote for, having seen a longer one
    than the client sent (``scripts/quarantine_longer.lua``); the client takes it from then
    on. Empty when no node said so."""
    found = {}
    for label, text in node_errors.items():
        match = _LONGER.match(text)
        if match is not None:
            found[label] = int(match[1])
    return found


_VOTES_AGAIN = re.compile(r"^QUARANTINED .*? votes again in (\d+) s")


def votes_again_in(reply: object) -> float | None:
    """Seconds until a node that refused as quarantined votes again, as its refusal says
    (``scripts/node_rule.lua``); None for any other reply."""
    if reply is TIMED_OUT or isinstance(reply, NodeError):
        found = _VOTES_AGAIN.match(str(reply))
        if found is not None:
            return float(found[1])
    return None


def quarantine_left(quorum: int, results: Sequence[Any]) -> float | None:
    """Seconds until a quorum of nodes votes again, when nodes refused with QUARANTINED
    (``scripts/node_rule.lua`` says in how many seconds each votes again); None when no node
    did, or when the nodes that did not answer leave it unknown.

    A node that answered anything else votes now; one not waited for is counted as voting
    (the round had its outcome without it); and so is one that timed out or failed
    otherwise: it may be back by the next round. So the wait is the quarantine's only when a
    quorum needs a quarantined node even if every failed node came back (counting a failed
    node as never back made a caller with no deadline sleep out a 60 s quarantine while the
    nodes it needed were restarting: found by test_outage's caller that waits).
    """
    said = [votes_again_in(reply) for reply in results]
    if all(left is None for left in said):
        return None
    ready = [0.0 if left is None else left for left in said]
    ready.sort()
    left = ready[quorum - 1]
    return left if left > 0 else None


EXPIRED = "expired"
"""``LockLost.cause``: the lease's validity ran out (with or without failed renewals)."""
TAKEN = "taken"
"""``LockLost.cause``: a quorum of nodes holds the lock for another token."""
GONE = "gone"
"""``LockLost.cause``: a quorum of nodes no longer holds the lease (absent or another token)."""


@dataclass(frozen=True)
class Lost:
    """A round found the lease ended: ``cause`` (:data:`EXPIRED`, :data:`TAKEN`,
    :data:`GONE`) and ``reason`` (words for ``LockLost``, the log and the signal)."""

    cause: str
    reason: str


@dataclass(frozen=True)
class Missed:
    """An extend round that neither renewed the lease on a quorum nor heard a quorum refuse
    it: the lease keeps the validity it had. ``renewed``/``refused``: node counts;
    ``reason``: the counts in words; ``node_errors``: label -> error of the silent nodes."""

    renewed: int
    refused: int
    reason: str
    node_errors: dict[str, str]


@dataclass(frozen=True)
class ExtendTally:
    """An extend round's replies counted (``scripts/extend.lua``): ``renewed`` (1: the key
    was there and is renewed), ``recreated`` (2: it was absent and is set again), ``taken``
    (-1: another holder has it), ``silent`` (an error, a timeout, or a reply not waited for:
    of those, ``waived`` were not waited for)."""

    renewed: int
    recreated: int
    taken: int
    silent: int
    waived: int

    def words(self, size: int) -> str:
        text = (
            f"renewed on {self.renewed} of {size} nodes, {self.recreated} had lost it "
            f"(set again), {self.taken} held it for another token, "
            f"{self.silent - self.waived} did not answer"
        )
        if self.waived:
            text += f", {self.waived} not waited for (the outcome was known)"
        return text


def extend_tally(results: Sequence[Any]) -> ExtendTally:
    """Count an extend round's replies (see :class:`ExtendTally`)."""
    renewed = recreated = taken = waived = 0
    for reply in results:
        if type(reply) is int:
            if reply == 1:
                renewed += 1
            elif reply == 2:
                recreated += 1
            elif reply < 0:
                taken += 1
        elif reply is PENDING:
            waived += 1
    silent = len(results) - renewed - recreated - taken
    return ExtendTally(renewed, recreated, taken, silent, waived)


def held_after_renewal(previous: Sequence[bool] | None, results: Sequence[Any]) -> Iterator[bool]:
    """Which nodes hold a lease after a renewal round that kept it (``results``, node by
    node; ``previous``: which held it before, None for every node): a node that renewed or
    re-created it does, one that said absent or another token does not, and a node that did
    not answer keeps what it held."""
    return (
        reply in (1, 2) if type(reply) is int else previous is None or previous[i]
        for i, reply in enumerate(results)
    )


def judge_extend(
    nodes: Nodes,
    ttl: float,
    expires_at: float,
    start: float,
    now: float,
    results: Sequence[Any],
    held: Sequence[bool] | None = None,
) -> float | Lost | Missed:
    """An extend round of a lease valid until ``expires_at``, sent at ``start`` and decided
    at ``now`` (seconds on the manager's monotonic clock): the new validity in seconds, or
    why the lease ended (:class:`Lost`), or :class:`Missed` when the round decided nothing.
    ``held``: which nodes held the lease after the round that granted or last renewed it
    (None: every node); a node that never had it may answer "absent" without a loss.

    The rules (issue 22), with Q the quorum:

    * Replies after the validity ran out count for nothing: the lease has ended.
    * Renewed (its keys were there) on Q nodes: the lease goes on from ``start``.
    * Renewed plus re-created on Q nodes, while the nodes that held it and did not answer
      "absent" or "another token" are still at least Q: it goes on too. The lease was valid,
      so its keys were on a quorum and no one else could hold one; those keys are either
      renewed or on nodes that did not answer, so the nodes that said "absent" did not hold
      another lease of this name, and our key there is what our acquire's late SET would be.
    * Another token on Q nodes: taken, lost at once.
    * Fewer than Q of the nodes that held it still do (renewed or silent): they answered
      that they lost it (force-released, or the nodes lost it), so someone else may have
      taken it, whatever the local clock says: gone, lost at once (and the keys it just set
      are freed by the caller's clean-up; the keys it still holds are not, see
      :func:`lost_clean_up`).
    * Otherwise (nodes did not answer): nothing changed. The lease keeps the validity it had:
      its keys are still on the quorum that granted it, so no other holder can be granted
      the lock meanwhile. Nothing is freed, and the caller tries again.
    """
    tally = extend_tally(results)
    counts = tally.words(nodes.size)
    if now >= expires_at:
        return Lost(
            EXPIRED,
            f"the lease expired: its validity ran out before a renewal reached a quorum in "
            f"time ({counts})",
        )
    quorum = nodes.quorum
    left = validity(ttl, now - start, nodes.drift_factor)
    # The nodes that held it and may still: they renewed it, or did not answer.
    had = sum(
        1
        for index, reply in enumerate(results)
        if (held is None or held[index]) and not (type(reply) is int and reply in (2, -1))
    )
    if left > 0 and had >= quorum and tally.renewed + tally.recreated >= quorum:
        return left
    details = summarise(nodes, results, of_lease=True)
    if tally.taken >= quorum:
        return Lost(TAKEN, f"taken by another holder ({counts}: {details})")
    if had < quorum:
        return Lost(GONE, f"no longer held by a quorum ({counts}: {details})")
    errors = node_errors(nodes, results)
    refused = nodes.size - had
    return Missed(tally.renewed + tally.recreated, refused, f"{counts} ({details})", errors)


def lost_clean_up(
    shape: Shape, token: str, cause: str, results: Sequence[Any]
) -> list[Command | None]:
    """The releases to send after an extend round (its ``results``) found the lease lost
    with ``cause``.

    Expired or taken: every key of ours that is left only keeps the next holder waiting, so
    all of them are freed. Gone (fewer than a quorum of the nodes that held the lease still
    do): only the keys this very round re-created (reply 2) are freed, so the nodes are left
    as the round found them. The verdict is a suspicion, not a proof: the nodes that lost
    the key may be ones that restarted (quarantined: they grant nobody) or ones that never
    granted the lease (they refused it, quarantined), and while the lease's validity runs
    the keys it still has on the other nodes are what keeps a rival from a quorum. Freeing
    them would turn the suspicion into an overlap (tests/core/test_fault_storm.py, strict):
    they expire by themselves within a ttl.
    """
    command = shape.release(token, "")
    if cause != GONE:
        return [command] * len(results)
    return [command if type(reply) is int and reply == 2 else None for reply in results]


NEVER_YES = object()
"""The ``yes_value`` of a round that must hear every node (no reply equals it): need = N and
give up after N - 1 others, so the round ends when the last node answered or at the deadline."""


def handoff_round(
    size: int, key: str, old: str, new: str, owner: str, quarantine_ms: int
) -> list[Command]:
    """Hand the lease on ``key`` from token ``old`` to ``new`` on every node
    (``scripts/handoff.lua``; send with ``identify=True``, :data:`NEVER_YES`)."""
    return [handoff_command((key,), old, new, owner, quarantine_ms)] * size


def handback_round(size: int, key: str, new: str, old: str, quarantine_ms: int) -> list[Command]:
    """The clean-up of a failed adopt: hand ``key`` back from the adopter's token ``new`` to
    the handle's ``old`` on every node, so the handle can be adopted again (a release of the
    new token instead would delete a lease nobody gave up)."""
    return [handback_command((key,), new, old, quarantine_ms)] * size


def judge_adopt(
    nodes: Nodes, name: str, ttl: float, results: Sequence[Any], elapsed: float
) -> float | str | QuorumUnreachable:
    """A hand-off round that took ``elapsed`` seconds: the adopted lease's validity in
    seconds; or why it cannot be adopted (text: the lease is gone); or, when too few nodes
    answered to tell, a :class:`QuorumUnreachable` to raise (the handle stays good).

    Each node that handed the key over answers the ms its key has left. As for an acquire, a
    quorum must agree, and the validity is what the quorum-th longest of them leaves after
    the round's time and the drift term: the adopter never gets more than the old lease had.
    """
    left = sorted((r for r in results if type(r) is int and r > 0), reverse=True)
    if len(left) < nodes.quorum:
        errors = node_errors(nodes, results)
        if len(left) + len(errors) >= nodes.quorum:
            # The nodes that refused are too few to say the lease is gone: an outage, not a
            # loss. The failed adopt hands the keys back, so the handle can be tried again.
            return QuorumUnreachable(name, votes=len(left), quorum=nodes.quorum, node_errors=errors)
        return (
            f"the handed-off lease ran out or was taken (released, or adopted elsewhere): "
            f"adopted on {len(left)} of {nodes.size} nodes, a quorum needs {nodes.quorum} "
            f"({summarise(nodes, results, of_lease=True)})"
        )
    valid = left[nodes.quorum - 1] / 1000 - elapsed - (ttl * nodes.drift_factor + DRIFT_SECONDS)
    if valid <= 0:
        return "the handed-off lease ran out before it was adopted"
    return valid


@dataclass(frozen=True)
class ReleaseVerdict:
    """A release round judged: ``lost`` says why the lease was lost (None when it was not);
    ``partial`` names the nodes that did not answer when fewer than a quorum released it."""

    lost: str | None
    partial: str | None


def judge_release(
    nodes: Nodes, results: Sequence[Any], deleted: int, expired: bool
) -> ReleaseVerdict:
    """A release round: ``deleted`` nodes held the key and deleted it; ``expired`` whether
    the lease had run out before the release. Nodes that did not answer while the lease was
    still valid are not a loss: their keys expire by themselves."""
    if expired:
        return ReleaseVerdict("the lease expired before it was released", None)
    gone = results.count(0)
    if gone > nodes.size - nodes.quorum:
        return ReleaseVerdict(
            f"only {deleted} of {nodes.size} nodes still held it at release "
            f"({summarise(nodes, results, of_lease=True)})",
            None,
        )
    if deleted < nodes.quorum:
        return ReleaseVerdict(None, summarise(nodes, results, of_lease=True))
    return _RELEASED


_RELEASED = ReleaseVerdict(None, None)
"""The usual verdict (immutable, so one object serves every release)."""


def owned(nodes: Nodes, yes: int, left: float) -> bool:
    """Whether a lease with ``left`` seconds of validity is still held, ``yes`` nodes
    having said they hold its token."""
    return yes >= nodes.quorum and left > 0


def holder_of(results: Iterable[Any]) -> dict[str, Any] | None:
    """From a holder round's replies (``[owner JSON, ms left]`` per node holding the lock):
    the owner record found on most nodes that answered (host, pid, thread, task, origin,
    acquired_at), plus ``nodes`` (how many hold it) and ``ttl`` (the longest remaining
    seconds among them); None when no node holds it. Never the token."""
    owners: dict[str, int] = {}
    ttls: dict[str, float] = {}
    for reply in results:
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


def is_locked(nodes: Nodes, owner: dict[str, Any] | None) -> bool:
    """Whether the holder found by :func:`holder_of` holds the lock on a quorum."""
    return owner is not None and owner["nodes"] >= nodes.quorum


# -- node errors, for logs and errors ------------------------------------------------------


def error_text(reply: object, node_timeout: float) -> str:
    """A failed node's reply as text (a timeout says how long was waited)."""
    if reply is TIMED_OUT:
        return f"no answer within {node_timeout * 1000:g} ms"
    return str(reply)


def node_errors(nodes: Nodes, results: Sequence[Any]) -> dict[str, str]:
    """Node label -> error text, for the nodes of a round that failed or timed out."""
    return {
        label: error_text(reply, nodes.node_timeout)
        for label, reply in zip(nodes.labels, results, strict=True)
        if reply is TIMED_OUT or isinstance(reply, NodeError)
    }


def has_node_errors(results: Iterable[Any]) -> bool:
    return any(reply is TIMED_OUT or isinstance(reply, NodeError) for reply in results)


def summarise(nodes: Nodes, results: Sequence[Any], *, of_lease: bool = False) -> str:
    """The nodes that did not do their part, for a log line or an error.

    ``of_lease``: the results of a release or extend, where 1 means done and 0 not held;
    otherwise of an acquire, where an integer is another holder's milliseconds left.
    """
    parts = []
    for label, reply in zip(nodes.labels, results, strict=True):
        if reply is TIMED_OUT or isinstance(reply, NodeError):
            parts.append(f"{label}: {error_text(reply, nodes.node_timeout)}")
        elif type(reply) is int and of_lease and reply == -1:
            parts.append(f"{label}: held for another token")  # the extend scripts' -1
        elif type(reply) is int and of_lease and reply == 2:
            parts.append(f"{label}: had lost it (set again)")  # the extend scripts' 2
        elif type(reply) is int and (reply == 0 or (of_lease and reply < 0)):
            parts.append(f"{label}: not held")
        elif type(reply) is int and not of_lease:
            parts.append(f"{label}: held by another for {reply} ms")
    return "; ".join(parts) or "no errors"
