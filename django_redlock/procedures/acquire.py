"""The acquire procedure: every kind (a lock, a semaphore slot, a read or write lease, several
locks), a single try or a blocking acquire with its place in line, hand-off grants and the
clean-ups of every exit. The only place that decides a step of an acquire.

The Redlock steps (the Redis "Distributed Locks with Redis" page): take the time on a
monotonic clock; send the SET (here a script) to all N nodes at once; the lock is acquired
when a quorum granted it and the validity ``ttl - elapsed - drift`` is still positive
(``procedures.flow.won``); otherwise unlock every node (the failed ones too: a timed-out SET may
still have landed) and retry after a random delay, or when a release wakes this waiter.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from django_redlock.procedures import flow
from django_redlock.procedures.effects import (
    LISTEN,
    Answer,
    Effect,
    Grants,
    Post,
    Round,
    Sleep,
    Subscribe,
    Wait,
)

if TYPE_CHECKING:
    from django_redlock.procedures.options import Checked
    from django_redlock.procedures.shapes import Shape

__all__ = ["AcquireHost", "acquire", "failed", "learn_quarantines", "resume"]

_L = TypeVar("_L")


class _Quarantine(Protocol):
    @property
    def ms(self) -> int: ...


class AcquireHost(Protocol[_L]):
    """What an acquire asks of the one it runs for (the engine; the simulator's client):
    the clock, the retry jitter, the first contact, the quarantine its tries send (and
    learn), and the bookkeeping around the decisions (building the first try, reporting a
    failed round and a give-up, making the lease). It decides nothing: what follows a
    round is decided here."""

    @property
    def clock(self) -> Callable[[], float]: ...

    @property
    def quarantine(self) -> _Quarantine: ...

    def contact(self) -> flow.Contact | None: ...

    def first_try(
        self, name: str, checked: Checked, waiter: str, shape: Shape
    ) -> flow.FirstTry: ...

    def uniform(self, low: float, high: float) -> float: ...

    def learn_quarantine(self, node: str, ms: int) -> None: ...

    def round_failed(self, attempt: flow.Acquire, step: flow.Failed) -> None: ...

    def gave_up(self, step: flow.Failed, origin: str | None) -> None: ...

    def grant(
        self,
        make: Callable[..., _L],
        attempt: flow.Acquire | flow.FirstTry,
        acquired_at: float,
        expires_at: float,
        results: Sequence[Any],
        scope: tuple[object, ...],
        checked: Checked,
    ) -> _L: ...


def acquire(
    host: AcquireHost[_L],
    make: Callable[..., _L],
    name: str,
    shape: Shape,
    scope: tuple[object, ...],
    checked: Checked,
    listens: bool,
) -> Generator[Effect, Any, _L]:
    """Acquire a lease of ``shape`` named ``name`` for ``scope`` (its arguments ``checked``),
    made by ``make`` through ``host.grant``. ``listens``: the driver hears releases (else
    every wait between tries is a sleep).

    Raises:
        LockNotAcquired: gave up (LockContended, QuorumUnreachable); the place in line is
            left and every key a try may have set is released.
        BaseException: whatever the driver threw in (an interrupt, a cancellation), after
            the same clean-ups.
    """
    contact = host.contact()
    if contact is not None:
        # Before the acquire begins (host.first_try takes its start): never counted against
        # its timeout (see flow.Contact).
        yield Round(contact.commands, b"PONG", contact.need)
    # A blocking acquire waits in a line with one ticket on every node (fair hand-off); a
    # single try never queues, nor does a shape without a line (it polls).
    waiter: str = (yield LISTEN) if checked.blocking and shape.wake_key is not None else ""
    # The first round without the flow object (flow.FirstTry): most acquires are won there;
    # the flow takes over, judging that round again, only when it was not.
    first = host.first_try(name, checked, waiter, shape)
    clock = host.clock
    attempt: flow.Acquire | None = None
    try:
        start = clock()
        try:
            exchange = yield Round(first.commands, first.decider, first.need, None, True)
        except GeneratorExit:  # closed unfinished: nothing can be posted any more
            raise
        except BaseException:
            # Interrupted or cancelled mid-round: some SETs may have landed, or may still
            # land on a slow node, and nobody else will release them.
            yield Post(first.interrupted())
            raise
        end = clock()
        results = exchange.results
        left = first.judge(results, exchange.yes, start, end)
        won: flow.FirstTry | flow.Acquire = first
        if left:
            acquired_at, expires_at = end, end + left
        else:
            won = attempt = resume(host, first, checked, listens)
            acquired_at, expires_at, results = yield from _rounds(
                host, attempt, checked, waiter, exchange, start, end
            )
        # Won: grants outside the lease freed (a semaphore's other slots), then the lease
        # made by the host. If making it raises, the caller never gets the lease: its keys
        # are freed (and the place in line left, below).
        strays = shape.won(won.token, results)
        if strays is not None:
            yield Post(strays)
        try:
            return host.grant(make, won, acquired_at, expires_at, results, scope, checked)
        except GeneratorExit:  # closed unfinished: nothing can be posted any more
            raise
        except BaseException:
            yield Post(won.interrupted())
            raise
    except GeneratorExit:
        raise
    except BaseException:
        if attempt is None:  # the first round was interrupted, or its grant failed
            attempt = resume(host, first, checked, listens)
        leave = attempt.left_line()
        if leave is not None:
            # Gave up, interrupted or cancelled: leave the line now (a post, no wait). A place
            # left behind would get the next release's wake-up, and the waiters behind it
            # would wait until it lapses.
            yield Post(leave)
        raise


def _rounds(
    host: AcquireHost[_L],
    attempt: flow.Acquire,
    checked: Checked,
    waiter: str,
    exchange: Answer,
    start: float,
    end: float,
) -> Generator[Effect, Any, tuple[float, float, Sequence[Any]]]:
    """The tries after a first round not won (its answer ``exchange``, sent at ``start`` and
    decided at ``end``: judged again here, by the flow), until one wins or hand-off grants
    make the lease: when it was taken, when its validity runs out (on the host's clock) and
    the replies that made it.

    Raises:
        LockNotAcquired: the flow gave up (the caller leaves the line).
    """
    clock = host.clock
    results = exchange.results
    while True:
        step = attempt.judge(results, exchange.yes, start, end)
        if type(step) is flow.Granted:
            return step.acquired_at, step.expires_at, results
        assert type(step) is flow.Failed
        # Unlock wherever our SET may have landed, posted on the connections the SETs went
        # out on, so a stalled node applies it after the SET when it wakes up.
        yield Post(step.clean_up)
        action = failed(host, attempt, step, checked.origin)
        held = yield from _between(action, attempt, waiter, clock)
        if held is not None:
            # A quorum of nodes granted the lock while it waited (hand-off): no round.
            return held.acquired_at, held.expires_at, attempt.granted_results()
        commands = attempt.next_round(host.quarantine.ms)
        start = clock()
        try:
            exchange = yield Round(commands, attempt.decider, attempt.need, None, True)
        except GeneratorExit:  # closed unfinished: nothing can be posted any more
            raise
        except BaseException:
            yield Post(attempt.interrupted())
            raise
        end = clock()
        results = exchange.results


def resume(
    host: AcquireHost[Any], first: flow.FirstTry, checked: Checked, listens: bool
) -> flow.Acquire:
    """The flow of the acquire whose first round was ``first`` (not won, or interrupted),
    its deadline set: a blocking acquire with no timeout has none; any other gives up
    ``checked.wait`` seconds (a single try: none) after its first try started. ``listens``:
    the driver hears releases."""
    wait = checked.wait
    deadline = None if (checked.blocking and wait is None) else first.started + (wait or 0.0)
    return flow.Acquire.after_first(first, deadline, listens, host.uniform)


def failed(
    host: AcquireHost[Any], attempt: flow.Acquire, step: flow.Failed, origin: str | None
) -> flow.Action:
    """What follows the failed round ``step`` of ``attempt`` (:meth:`flow.Acquire.after`),
    once the quarantines its refusals name are learnt and the round is reported; a
    :class:`~django_redlock.procedures.flow.GiveUp` carries the error to raise, the give-up
    reported (with the acquire's ``origin``)."""
    learn_quarantines(host, step.error.node_errors)
    host.round_failed(attempt, step)
    action = attempt.after(step)
    if type(action) is flow.GiveUp:
        host.gave_up(step, origin)
    return action


class _Learns(Protocol):
    def learn_quarantine(self, node: str, ms: int) -> None: ...


def learn_quarantines(host: _Learns, node_errors: dict[str, str]) -> None:
    """Take the longer quarantines nodes refused a vote for (``node_errors`` of a failed
    round: :func:`~django_redlock.procedures.flow.longer_quarantines`), each told to the host,
    which sends the longest with every later acquire: a node that restarted empty must not
    vote before every lease any of its clients may have been granted has run out."""
    for node, ms in flow.longer_quarantines(node_errors).items():
        host.learn_quarantine(node, ms)


def _between(
    action: flow.Action, attempt: flow.Acquire, waiter: str, clock: Callable[[], float]
) -> Generator[Effect, Any, flow.Granted | None]:
    """Carry out what the flow said after a failed round, and tell it how the wait ended;
    the lease's grant when a quorum of nodes handed the lock over meanwhile.

    Raises:
        LockNotAcquired: the flow gave up (reported already).
    """
    if isinstance(action, flow.Sleep):
        yield Sleep(action.delay)
        attempt.waited(False)
        return None
    if isinstance(action, flow.GiveUp):
        raise action.error
    wait: flow.Wait | None
    if isinstance(action, flow.Subscribe):
        fresh: bool = yield Subscribe(action.key, waiter)
        wait = attempt.subscribed(fresh, action.delay)
        if wait is None:
            return None  # try at once: that try covers a release before the subscription
    else:
        wait = action
    attempt.waited((yield Wait(waiter, wait.delay, wait.need)))
    if not wait.need:
        return None
    grants: Mapping[int, int] = yield Grants(waiter)
    return attempt.hear_grants(grants, clock())
